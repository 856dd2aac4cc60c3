"""RQ entry points. A job carries only a run id: the database is the truth, the queue a doorbell,
and a duplicate job is harmless (its claim finds the run taken or settled)."""

from __future__ import annotations

from .core.types import AbortSignal
from .runtime import engine
from .worker import shutdown as worker_shutdown


def execute_run(run_id: str, *, shutdown: AbortSignal = worker_shutdown) -> str | None:
    """One execution of ``run_id``. ``shutdown``: the signal that drains it (the RQ worker's SIGTERM,
    or the embedded executor's)."""
    return engine.execute(run_id, shutdown=shutdown)
