"""Named crash points for fault-injection tests: ``CHAMVI_CRASH_AT=after_claim,mid_stream`` makes
the process SIGKILL itself when it reaches one of those points. With ``CHAMVI_CRASH_MARKER`` set to
a directory, each point fires once across processes (a file per point records that it fired), so the
recovering worker gets past it. Unset (production), a crash point is one comparison.

Points: ``after_claim``, ``mid_stream`` (after the first delta), ``before_step_commit`` (inside the
step transaction, writes done, not committed), ``after_step_commit``, ``after_effect_record`` (an
effect tool's record committed, its step not yet), ``before_enqueue`` (a run committed, its job not
yet sent), ``before_settle``.
"""

from __future__ import annotations

import os
import signal

_POINTS = frozenset(filter(None, os.environ.get("CHAMVI_CRASH_AT", "").split(",")))


def crash_point(name: str) -> None:
    if name not in _POINTS:
        return
    marker = os.environ.get("CHAMVI_CRASH_MARKER")
    if marker:
        try:
            # O_EXCL: of two processes reaching the point at once, only one crashes.
            os.close(os.open(os.path.join(marker, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
