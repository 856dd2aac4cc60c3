"""The buffer this process uses: the mode (``chamvi_runs.modes``) picks one of the two stores made
here, the queue's Redis when runs execute in workers, else memory."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...modes import mode
from .memory import MemoryEventLog
from .redis_log import RedisEventLog

if TYPE_CHECKING:
    from redis import Redis


class _Stores:
    """One memory store per process, one Redis store per queue (``modes.EventLogs``)."""

    def __init__(self) -> None:
        self.memory = MemoryEventLog()
        self.redis: dict[str, RedisEventLog] = {}
        self.lock = threading.Lock()

    def in_memory(self) -> MemoryEventLog | RedisEventLog:
        return self.memory

    def in_redis(self, queue: str, redis: Redis) -> MemoryEventLog | RedisEventLog:
        with self.lock:
            if queue not in self.redis:
                self.redis[queue] = RedisEventLog(redis)
            return self.redis[queue]


_stores = _Stores()


def event_log() -> MemoryEventLog | RedisEventLog:
    return mode().event_log(_stores)
