"""Embedded mode (``EXECUTOR = "thread"``): this process executes the runs it rings for, in its own
threads, and keeps their events in its memory; no queue, no Redis, nothing shared to count in."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .base import EventLogs, L, Mode
from .threads import ThreadExecutor


class Embedded(Mode):
    def __init__(self) -> None:
        self._executor: ThreadExecutor | None = None
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return "the embedded executor"

    def executor(self) -> ThreadExecutor:
        """The process's executor threads, started by the first call."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadExecutor()
            return self._executor

    def ring(self, run_id: str, stamp: Callable[[], dict[str, str]]) -> None:
        self.executor().submit(run_id)

    def waiting_jobs(self) -> set[str]:
        return self.executor().pending()

    def event_log(self, logs: EventLogs[L]) -> L:
        return logs.in_memory()

    def count_drops(self, key: str, kind: str, count: int) -> None:
        """Nothing: this process is the only one, and counts its own (``web.consumers.DROPS``)."""
