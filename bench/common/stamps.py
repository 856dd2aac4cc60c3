"""Send-time stamps carried inside streamed text, so the receiver can measure latency end to end
without trusting anything in between (deltas may be coalesced: one may hold several stamps)."""

from __future__ import annotations

import re
import time

_STAMP = re.compile(r"⟨(\d+)⟩")


def stamp() -> str:
    """The current wall clock in microseconds, bracketed. Wall clock, not monotonic: the sender and
    the receiver are different processes (on one host, so one clock)."""
    return f"⟨{time.time_ns() // 1000}⟩"


def latencies_ms(text: str, received_at: float) -> list[float]:
    """``received_at`` (``time.time()``) minus every stamp in ``text``, in milliseconds."""
    return [(received_at - int(us) / 1e6) * 1000 for us in _STAMP.findall(text)]


def count(text: str) -> int:
    return len(_STAMP.findall(text))
