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

import logging
import time
from typing import Any

import redis
from django.db import connections
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from .core.types import AbortSignal

logger = logging.getLogger(__name__)

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

    # RQ's loop talks to Redis around each job (suspension check, maintenance, recording the job's
    # end, the worker's heartbeat); a ConnectionError there escapes it and the worker quits, while
    # its dequeue waits for Redis to come back. The run is in the database either way: a settled
    # run stays settled, an unsettled one's lease expires and chamvi_tick re-enqueues it. So these
    # log and go on, and the next dequeue waits.
    def _unless_redis_away(self, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except redis.exceptions.ConnectionError as exc:
            logger.warning("%s: Redis went away (%s); the worker waits for it", what, exc)
            return None

    def execute_job(self, job: Any, queue: Any) -> None:
        self._unless_redis_away(f"job {job.id}", super().execute_job, job, queue)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:  # part of a caller's transaction, which handles its errors
            super().heartbeat(timeout, pipeline)
        else:
            self._unless_redis_away("heartbeat", super().heartbeat, timeout)

    def check_for_suspension(self, burst: bool) -> None:
        self._unless_redis_away("suspension check", super().check_for_suspension, burst)

    def run_maintenance_tasks(self) -> None:
        self._unless_redis_away("maintenance", super().run_maintenance_tasks)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        # It waits for Redis itself once it is listening; what it writes before (its state) does not.
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except redis.exceptions.ConnectionError as exc:
                logger.warning("dequeue: Redis went away (%s); retrying in 1 s", exc)
                time.sleep(1)
