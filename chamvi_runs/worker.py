"""The RQ worker class for chamvi queues: ``RQ = {"WORKER_CLASS": "chamvi_runs.worker.Worker"}``.

It runs each job in the worker process itself (RQ's SimpleWorker) rather than forking a work horse
per job: the execution's lease keeper is a thread of that process, database connections are reused
from job to job, and SIGTERM can drain the execution in place. Web processes under ASGI must not
keep connections (``CONN_MAX_AGE = 0``: each request's sync code runs in a thread of its own), but
a worker is one long-lived thread: it keeps its connection, and ``close_old_connections()`` at the
start of every execution still drops one that broke (with ``CONN_HEALTH_CHECKS``). A crash of the
process loses no run: its lease expires and ``chamvi_tick`` re-enqueues it.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
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
        for connection in connections.all():
            if connection.settings_dict.get("CONN_MAX_AGE") == 0:
                connection.settings_dict["CONN_MAX_AGE"] = None

    def request_stop(self, signum: Any, frame: Any) -> None:
        shutdown.set("drain")
        super().request_stop(signum, frame)
