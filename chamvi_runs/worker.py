"""The RQ worker class for chamvi queues: ``RQ = {"WORKER_CLASS": "chamvi_runs.worker.Worker"}``.

It runs jobs in the worker process itself (RQ's SimpleWorker) rather than forking a work horse per
job: database connections are reused from job to job, the lease keeper is a thread of the process,
and SIGTERM can drain executions in place.

A process executes up to ``CONCURRENCY`` runs at once, each in a thread of its own
(``modes.ThreadExecutor``): a job only hands its run id to a free thread, and the worker
takes the next job from the queue only while a thread is free, so a full worker leaves jobs to the
others. Runs wait on the model most of the time, so threads share one process well; a tool that
kills the process takes its siblings' executions with it, and their leases bring them back.

Web processes under ASGI must not keep connections (``CONN_MAX_AGE = 0``: each request's sync code
runs in a thread of its own), but a worker's threads are long-lived: each keeps its connection (or,
with Django's connection pool, hands it back while its run waits on the model), and
``close_old_connections()`` around every execution still drops one that broke (with
``CONN_HEALTH_CHECKS``). A crash of the process loses no run: its lease expires and
``chamvi_tick`` re-enqueues it.

Several sites whose workers share a Redis queue (the default name, ``chamvi``) would take each
other's jobs: a job stamped by another site, for a run this database does not hold, goes back to
the queue untouched, and the worker logs an error naming the fix once (``dispatch.sites``).

During a deploy, old and new workers share the queue: each says which agent versions it has
(``runtime.presence``), claims only runs of those, and puts a job of another version back for a
live worker that has it, or drops it when none has (``dispatch.versions``).

With ``CHAMVI_RUNS["METRICS_PORT"]`` set, the process serves its Prometheus metrics on that port
(``chamvi_runs.metrics``): its executions, steps and events are counted here, not in a web process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from django.db import connections
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from .agents.agent import registry
from .conf import conf
from .core.types import AbortSignal
from .dispatch import sites, versions
from .modes import EXECUTE, ThreadExecutor
from .runtime.presence import presence
from .store.connections import pooled

logger = logging.getLogger(__name__)

shutdown = AbortSignal()
"""Set on SIGTERM/SIGINT: executions of this process settle ``interrupted`` within seconds."""

executions: ThreadExecutor | None = None
"""The threads executing runs, in a process working as an RQ worker (``jobs.execute_run`` hands its
run to them); None elsewhere."""

DRAIN_SECONDS = 30
"""How long a stopping worker waits for its executions to settle ``interrupted`` (they take a few
seconds: the model call is aborted, the step in flight may finish its writes)."""


COMMANDS_POLL_SECONDS = 1.0
"""How long the thread that listens for RQ's worker commands (stop a job, shut down) blocks on one
read: also how long a stopping worker may wait for it."""

FOREIGN_JOB_PAUSE = 1.0
"""How long a worker that finds only other sites' (or other versions') jobs in its queue waits
before looking again."""


class Worker(SimpleWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Jobs carry only a run id; JSON keeps the queue readable from any language and never unpickles.
        kwargs["serializer"] = JSONSerializer
        super().__init__(*args, **kwargs)
        for connection in connections.all():
            # A pool (Django's, for PostgreSQL) needs CONN_MAX_AGE 0, and keeps connections itself.
            if connection.settings_dict.get("CONN_MAX_AGE") == 0 and not pooled(connection):
                connection.settings_dict["CONN_MAX_AGE"] = None
        global executions
        if executions is None:
            executions = ThreadExecutor(conf.CONCURRENCY, job=EXECUTE, shutdown=shutdown)
        self.run_threads = executions
        self.router = versions.Router()
        port = conf.METRICS_PORT
        if port is not None:
            from . import metrics  # prometheus-client: the system checks ask for it (E024)

            metrics.serve(port, conf.METRICS_ADDR)

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        cold = False
        # Which agent versions this worker has, said before it takes a job (SPEC §14).
        presence.start()
        try:
            return bool(super().work(burst, *args, **kwargs))
        except SystemExit:
            cold = True  # a second signal: leave now, the leases bring the runs back
            raise
        finally:
            if not cold:
                self._drain(burst)
                # Its versions are not live from now on: their runs wait for another worker, or
                # their agent's rule.
                presence.stop()

    def _drain(self, burst: bool) -> None:
        if burst and not shutdown.is_set():
            # The queue is empty: what was taken still executes to its end.
            self.run_threads.wait_idle(None)
            return
        shutdown.set("drain")
        if not self.run_threads.wait_idle(DRAIN_SECONDS):
            logger.warning("%d executions did not settle within %d s", self.run_threads.busy(), DRAIN_SECONDS)

    def subscribe(self) -> None:
        # RQ's, with a read that ends every COMMANDS_POLL_SECONDS instead of RQ's 60 s. RQ stops the
        # thread after unsubscribing, and a thread that reads the unsubscribe's reply before the stop
        # then waits its read's time for a new subscription; redis-py 8.2's stop() waits for the
        # thread, so a worker told to stop (a deploy's SIGTERM) took up to a minute to exit.
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ's is typed None
            sleep_time=COMMANDS_POLL_SECONDS, daemon=True, exception_handler=self._pubsub_exception_handler
        )

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
        # A job is taken only when a thread is free to start it: a full worker leaves jobs to others.
        while not self.run_threads.wait_for_free(1.0):
            self.heartbeat()
        put_back: set[str] = set()
        mine = registry.versions()
        try:
            while True:
                result = self._dequeue(timeout, max_idle_time)
                if result is None:
                    return None
                job, queue = result
                database = sites.foreign_site(job)
                route = self.router.route(job, mine) if database is None else None
                if route is versions.Route.TAKE:
                    return result
                if route is versions.Route.DROP:
                    self._drop(job, queue)
                    versions.report_drop(job, mine)
                    continue
                self._put_back(job, queue)
                if database is not None:
                    sites.report_once(job, queue.name, database)
                if job.id in put_back:
                    # Only jobs for other sites or versions are left: a burst is done; otherwise
                    # wait before looking again, or the worker would spin on them.
                    if timeout is None:
                        return None
                    connections.close_all()
                    shutdown.wait(FOREIGN_JOB_PAUSE)
                    self.heartbeat()
                put_back.add(job.id)
        finally:
            # This thread executes no run: the connection the checks may have opened (once per
            # process, or for another site's or version's jobs) is not kept beside the executions'.
            connections.close_all()

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> Any:
        # It waits for Redis itself once it is listening; what it writes before (its state) does not.
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except redis.exceptions.ConnectionError as exc:
                logger.warning("dequeue: Redis went away (%s); retrying in 1 s", exc)
                time.sleep(1)

    def _drop(self, job: Any, queue: Any) -> None:
        """``job`` leaves the queue: no live worker has its run's version (``dispatch.versions``)."""
        with self.connection.pipeline() as pipeline:
            # Taken from the queue, it is in no registry yet: its hash is all there is to remove.
            pipeline.lrem(queue.intermediate_queue_key, 1, job.id)
            pipeline.delete(job.key)
            pipeline.execute()

    def _put_back(self, job: Any, queue: Any) -> None:
        """``job`` to the end of its queue as it was: its hash is not touched (still ``queued``), and
        it leaves the list RQ moved it to while a worker takes it (or RQ's cleanup would fail it)."""
        with self.connection.pipeline() as pipeline:
            pipeline.lrem(queue.intermediate_queue_key, 1, job.id)
            queue.push_job_id(job.id, pipeline=pipeline)
            pipeline.execute()
