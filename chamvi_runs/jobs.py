"""RQ entry points. A job carries only a run id: the database is the truth, the queue a doorbell,
and a duplicate job is harmless (its claim finds the run taken or settled)."""

from __future__ import annotations

from . import worker
from .core.types import AbortSignal
from .runtime import engine


def execute_run(run_id: str, *, shutdown: AbortSignal = worker.shutdown) -> str | None:
    """One execution of ``run_id``. ``shutdown``: the signal that drains it (the RQ worker's SIGTERM,
    or the embedded executor's).

    In an RQ worker the job hands the run to one of the process's ``CONCURRENCY`` threads and
    returns None at once; elsewhere (the embedded executor, a test) it executes here and returns
    the status the execution left, or None when the run could not be claimed."""
    if worker.executions is not None and shutdown is worker.shutdown:
        worker.executions.submit(run_id)
        return None
    return engine.execute(run_id, shutdown=shutdown)
