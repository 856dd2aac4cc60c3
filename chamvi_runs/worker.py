"""The RQ worker class for chamvi queues: ``RQ = {"WORKER_CLASS": "chamvi_runs.worker.Worker"}``.

It runs each job in the worker process itself (RQ's SimpleWorker) rather than forking a work horse
per job: the execution's lease keeper is a thread of that process, database connections are reused
from job to job, and SIGTERM can drain the execution in place. A crash of the process loses no run:
its lease expires and ``chamvi_tick`` re-enqueues it.
"""

from __future__ import annotations

from typing import Any

from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from .core.types import AbortSignal

shutdown = AbortSignal()
"""Set on SIGTERM/SIGINT: executions of this process settle ``interrupted`` within seconds."""


class Worker(SimpleWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Jobs carry only a run id; JSON keeps the queue readable from any language and never unpickles.
        kwargs["serializer"] = JSONSerializer
        super().__init__(*args, **kwargs)

    def request_stop(self, signum: Any, frame: Any) -> None:
        shutdown.set("drain")
        super().request_stop(signum, frame)
