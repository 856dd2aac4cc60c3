"""Where runs execute: RQ workers (``EXECUTOR = "rq"``) or threads of this process (``"thread"``,
the embedded demo). Both enqueue after the surrounding transaction commits and both call
``engine.execute`` with the run id only."""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connection, transaction

from .conf import conf
from .core.types import AbortSignal
from .faults import crash_point

if TYPE_CHECKING:
    from .models import Run

logger = logging.getLogger(__name__)


def enqueue(run_id: str) -> None:
    """Ring the doorbell for ``run_id`` once the current transaction (if any) commits."""
    transaction.on_commit(lambda: _enqueue_now(run_id), robust=True)


def _enqueue_now(run_id: str) -> None:
    crash_point("before_enqueue")
    if conf.EXECUTOR == "thread":
        thread_executor().submit(run_id)
        return
    rq_queue(conf.QUEUE).enqueue(
        "chamvi_runs.jobs.execute_run",
        run_id,
        # The run id in the job id lets the janitor see which runs already have a job waiting.
        job_id=f"chamvi-{secrets.token_hex(4)}-{run_id}",
        # One job is one execution, which may stream for long; the lease, not RQ, bounds it.
        job_timeout=-1,
        result_ttl=600,
        failure_ttl=86400,
    )


_queues: dict[str, Any] = {}
_queues_lock = threading.Lock()


def rq_queue(name: str) -> Any:
    """The RQ queue, built once per process: django_rq.get_queue opens a new Redis client per call."""
    import django_rq
    from rq.serializers import JSONSerializer

    with _queues_lock:
        if name not in _queues:
            _queues[name] = django_rq.get_queue(name, serializer=JSONSerializer)
        return _queues[name]


def waiting_jobs() -> set[str]:
    """Ids of runs that have a job waiting in the queue, so the janitor rings no doorbell twice."""
    if conf.EXECUTOR == "thread":
        return thread_executor().pending()
    return {
        job_id.split("-", 2)[2]
        for job_id in rq_queue(conf.QUEUE).get_job_ids()
        if job_id.startswith("chamvi-")
    }


def enqueue_next_in_line(run: Run) -> None:
    from . import queries

    for run_id in queries.next_in_line(run):
        enqueue(run_id)


class ThreadExecutor:
    """A few daemon threads executing runs of this process (embedded mode)."""

    def __init__(self, size: int = 4) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self.shutdown = AbortSignal()
        self.threads = [
            threading.Thread(target=self._work, name=f"chamvi-exec-{n}", daemon=True) for n in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._pending:
                return
            self._pending.add(run_id)
        self.queue.put(run_id)

    def pending(self) -> set[str]:
        with self._lock:
            return set(self._pending)

    def _work(self) -> None:
        from . import engine

        while True:
            run_id = self.queue.get()
            with self._lock:
                self._pending.discard(run_id)
            try:
                close_old_connections()
                engine.execute(run_id, shutdown=self.shutdown)
            except Exception:
                logger.exception("run %s: execution failed", run_id)
            finally:
                connection.close()
                self.queue.task_done()


_executor: ThreadExecutor | None = None
_executor_lock = threading.Lock()


def thread_executor() -> ThreadExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadExecutor()
        return _executor


class _Embedded:
    """Whether this process asked to execute runs in embedded mode, and whether its threads run.

    System check W004 imports the site's ASGI application to see whether it asks; while it does
    (``inspecting``), ``start_embedded()`` records the request and starts nothing: ``manage.py
    migrate`` must execute no run. The check then forgets the module, so the server that imports
    it next (``runserver``, in the same process) runs ``start_embedded()`` for real.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requested = False
        self.started = False
        self.inspecting = False


_embedded = _Embedded()


@contextmanager
def inspecting() -> Iterator[None]:
    """While the block runs, ``start_embedded()`` records the request and starts nothing."""
    with _embedded.lock:
        _embedded.inspecting = True
    try:
        yield
    finally:
        with _embedded.lock:
            _embedded.inspecting = False


def embedded_requested() -> bool:
    return _embedded.requested


def start_embedded(interval: float = 2.0) -> None:
    """Embedded mode (``EXECUTOR = "thread"``): start the executor threads and a janitor thread in
    this process, so a single daphne process serves, executes and recovers. Idempotent; no-op with RQ.
    ``chamvi_runs.asgi.get_asgi_application()`` calls it for you."""
    if conf.EXECUTOR != "thread":
        return
    with _embedded.lock:
        _embedded.requested = True
        if _embedded.started or _embedded.inspecting:
            return
        thread_executor()
        _embedded.started = True

    def loop() -> None:
        import time

        from .janitor import tick_once

        while True:
            try:
                tick_once()
            except Exception:
                logger.exception("embedded janitor tick failed")
            finally:
                connection.close()
            time.sleep(interval)

    threading.Thread(target=loop, name="chamvi-janitor", daemon=True).start()
