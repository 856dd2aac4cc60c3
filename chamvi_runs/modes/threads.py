"""Threads of this process executing runs: embedded mode's executor, and the ``CONCURRENCY``
executions of an RQ worker process. They call their job by its typed reference (``jobs.py``), so the
mode imports no engine: the engine imports the doorbell, never the other way round."""

from __future__ import annotations

import logging
import queue
import threading

from django.db import close_old_connections

from ..core.types import AbortSignal
from .jobs import EXECUTE_RUN, Job

logger = logging.getLogger(__name__)


class ThreadExecutor:
    """``size`` daemon threads executing runs of this process, each run id once at a time.

    A thread keeps its database connection from run to run, as the process's settings say
    (``close_old_connections``: persistent in a worker, per run under ``CONN_MAX_AGE = 0``, back to
    the pool with one)."""

    def __init__(self, size: int = 4, *, job: Job = EXECUTE_RUN, shutdown: AbortSignal | None = None) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        self._pending: set[str] = set()
        self._busy = 0
        self._lock = threading.Condition()
        self._job = job
        self.size = size
        self.shutdown = shutdown or AbortSignal()
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

    def wait_for_free(self, timeout: float | None) -> bool:
        """Wait until a thread could start a run now. False: all were busy for ``timeout``."""
        with self._lock:
            return self._lock.wait_for(lambda: self._busy + len(self._pending) < self.size, timeout)

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no run is executing or waiting for a thread."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._busy and not self._pending, timeout)

    def busy(self) -> int:
        with self._lock:
            return self._busy + len(self._pending)

    def _work(self) -> None:
        job = self._job.load()
        while True:
            run_id = self.queue.get()
            with self._lock:
                self._pending.discard(run_id)
                self._busy += 1
            try:
                close_old_connections()
                job(run_id, shutdown=self.shutdown)
            except Exception:
                logger.exception("run %s: execution failed", run_id)
            finally:
                close_old_connections()
                with self._lock:
                    self._busy -= 1
                    self._lock.notify_all()
                self.queue.task_done()
