"""RQ entry points. A job carries only a run id: the database is the truth, the queue a doorbell,
and a duplicate job is harmless (its claim finds the run taken or settled)."""

from __future__ import annotations

from . import engine
from .worker import shutdown


def execute_run(run_id: str) -> str | None:
    return engine.execute(run_id, shutdown=shutdown)
