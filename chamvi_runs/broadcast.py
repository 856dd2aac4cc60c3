"""Publishing run events: a per-run ``seq`` and a replay buffer, then the channel layer.

``seq`` starts at 1 and grows by 1 per run across every process: it is allocated in Redis when the
queue's Redis is in use, else in this process (embedded mode, one process by definition). Deltas are
disposable: a failing channel layer never fails a run.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync

from .conf import conf

logger = logging.getLogger(__name__)


def run_group(run_id: str) -> str:
    return f"chamvi.run.{run_id}"


def thread_group(thread: str) -> str:
    # Group names allow only ASCII alphanumerics, hyphens, underscores and periods, < 100 chars.
    import hashlib

    return f"chamvi.thread.{hashlib.sha256(thread.encode()).hexdigest()[:40]}"


class MemoryEventLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[dict[str, Any]]] = {}

    def append(self, run_id: str, event: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            events = self._events.setdefault(run_id, [])
            event = {**event, "seq": len(events) + 1}
            events.append(event)
            return event

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events.get(run_id, []) if e["seq"] > seq]


class RedisEventLog:
    """One Redis list per run (index = seq - 1) and a counter, both expiring after the buffer time."""

    # Allocate the seq and append in one server-side step, so seq order equals list order. The seq is
    # spliced into the JSON text: cjson would turn empty lists into objects.
    SCRIPT = """
    local seq = redis.call('INCR', KEYS[1])
    local encoded = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
    redis.call('RPUSH', KEYS[2], encoded)
    redis.call('EXPIRE', KEYS[1], ARGV[2])
    redis.call('EXPIRE', KEYS[2], ARGV[2])
    return encoded
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._append = connection.register_script(self.SCRIPT)

    def append(self, run_id: str, event: dict[str, Any]) -> dict[str, Any]:
        ttl = int(conf.STREAM_BUFFER_SECONDS)
        keys = [f"chamvi:seq:{run_id}", f"chamvi:events:{run_id}"]
        encoded = self._append(keys=keys, args=[json.dumps(event), max(ttl, 1)])
        return json.loads(encoded)

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.connection.lrange(f"chamvi:events:{run_id}", seq, -1)]


_memory_log = MemoryEventLog()


def event_log() -> MemoryEventLog | RedisEventLog:
    if conf.EXECUTOR == "thread":
        return _memory_log
    import django_rq

    return RedisEventLog(django_rq.get_connection(conf.QUEUE))


class ChannelsBroadcaster:
    def __init__(self, thread: str | None = None) -> None:
        self.thread = thread
        self.log = event_log()

    def publish(self, run_id: str, event: dict[str, Any]) -> dict[str, Any] | None:
        try:
            stamped = self.log.append(run_id, {**event, "run_id": run_id})
        except Exception:
            logger.exception("could not record event %s of run %s", event.get("type"), run_id)
            return None
        try:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            if layer is not None:
                message = {"type": "chamvi.event", "event": stamped}
                async_to_sync(layer.group_send)(run_group(run_id), message)
                if self.thread:
                    async_to_sync(layer.group_send)(thread_group(self.thread), message)
        except Exception:
            logger.warning("could not broadcast event %s of run %s", event.get("type"), run_id, exc_info=True)
        return stamped
