"""The functions a run id is handed to, each named once.

RQ stores a job as the import path of its function and imports it in the worker, and the embedded
executor's threads look it up the same way: nothing below the runtime may import the engine, so the
reference is typed and resolved where it is called. A job enqueued by an older release names the
same path, so these paths must stay importable; ``tests/unit/test_modes.py`` resolves each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Job:
    path: str
    """The function's import path, as RQ stores it (``rq.job.Job.func_name``)."""

    def load(self) -> Callable[..., object]:
        function: Callable[..., object] = import_string(self.path)
        return function


EXECUTE_RUN = Job("chamvi_runs.jobs.execute_run")
"""What a doorbell asks to be called with the run id, in an RQ worker or an embedded thread."""
EXECUTE = Job("chamvi_runs.runtime.engine.execute")
"""What a thread of an RQ worker calls: the execution itself (the job hands the run over)."""
