"""Which execution the current thread works for, so that every log record emitted meanwhile can
name its run, attempt and worker (``chamvi_runs.logs`` adds them to records).

An execution binds its claim for as long as it runs (``bound``); code that acts for one execution
from another thread (the lease keeper, the events writer) binds that execution's context around
what it logs about it. A context variable is per thread (each thread starts with an empty
context), so executions running side by side in one process never see each other's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from .records import Claim


@dataclass(frozen=True)
class LogContext:
    run_id: str
    attempt: int
    worker: str
    """The claim's owner: host, process, thread and a random suffix."""


def of(claim: Claim) -> LogContext:
    return LogContext(claim.run_id, claim.attempt, claim.owner)


_current: ContextVar[LogContext | None] = ContextVar("chamvi_runs_log_context", default=None)


def current() -> LogContext | None:
    """The execution this thread works for now, or None."""
    return _current.get()


@contextmanager
def bound(context: LogContext | None) -> Iterator[None]:
    """Work for ``context`` (None: for no execution) inside the block, then as before."""
    token = _current.set(context)
    try:
        yield
    finally:
        _current.reset(token)
