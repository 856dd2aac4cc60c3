"""The embedded executor: a few daemon threads of this process executing runs (``EXECUTOR =
"thread"``). Like an RQ worker it calls the job by its dotted path, so dispatching imports no
engine: the engine imports the doorbell, never the other way round."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import close_old_connections, connection
from django.utils.module_loading import import_string

from ..core.types import AbortSignal

logger = logging.getLogger(__name__)

# What a doorbell asks to be called with the run id, in RQ and here.
JOB = "chamvi_runs.jobs.execute_run"


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
        job: Callable[..., object] = import_string(JOB)
        while True:
            run_id = self.queue.get()
            with self._lock:
                self._pending.discard(run_id)
            try:
                close_old_connections()
                job(run_id, shutdown=self.shutdown)
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
