"""The buffer this process uses: Redis (the queue's) when runs execute in workers, else memory."""

from __future__ import annotations

import threading

from ...conf import conf
from .memory import MemoryEventLog
from .redis_log import RedisEventLog

_memory_log = MemoryEventLog()
_redis_logs: dict[str, RedisEventLog] = {}
_logs_lock = threading.Lock()


def event_log() -> MemoryEventLog | RedisEventLog:
    if conf.EXECUTOR == "thread":
        return _memory_log
    import django_rq

    # One client (and connection pool) per queue and process: redis-py clients are thread-safe.
    with _logs_lock:
        if conf.QUEUE not in _redis_logs:
            _redis_logs[conf.QUEUE] = RedisEventLog(django_rq.get_connection(conf.QUEUE))
        return _redis_logs[conf.QUEUE]
