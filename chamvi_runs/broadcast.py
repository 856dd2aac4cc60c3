"""Publishing run events: a per-run ``seq`` and a replay buffer, then the channel layer.

``seq`` starts at 1 and grows by 1 per run across every process: it is allocated in Redis when the
queue's Redis is in use, else in this process (embedded mode, one process by definition). Deltas are
disposable: a failing channel layer never fails a run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

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


class Publisher:
    """Sends to the channel layer from synchronous code, in order, without blocking the caller.

    One event loop serves every publish of the process: ``async_to_sync`` per event would open a
    loop (and a Redis connection) per delta. When the process also serves websockets from an
    in-memory layer, the server's own loop is used instead (``use_loop``), because that layer's
    queues belong to the loop the consumers wait on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] | None = None

    def use_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._loop is None:
                self._start_on(loop)

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        ready = threading.Event()

        def create() -> None:
            self._queue = asyncio.Queue()
            loop.create_task(self._drain(self._queue))
            ready.set()

        loop.call_soon_threadsafe(create)
        ready.wait(5)

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="chamvi-publisher", daemon=True).start()
                self._start_on(loop)
            assert self._loop is not None
            return self._loop

    async def _drain(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        from channels.layers import get_channel_layer

        while True:
            item = await queue.get()
            if item is None:
                return
            group, message = item
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await layer.group_send(group, message)
            except Exception:
                logger.warning("could not broadcast to %s", group, exc_info=True)

    def send(self, group: str, message: dict[str, Any]) -> None:
        loop = self._ensure()
        queue = self._queue
        assert queue is not None
        loop.call_soon_threadsafe(queue.put_nowait, (group, message))

    def flush(self, timeout: float = 5) -> None:
        """Wait until everything sent so far has been handed to the layer (tests, shutdown)."""
        loop = self._ensure()
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: loop.create_task(_when_empty(self._queue, done)))
        done.wait(timeout)


async def _when_empty(queue: asyncio.Queue[Any] | None, done: threading.Event) -> None:
    while queue is not None and not queue.empty():
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.01)
    done.set()


publisher = Publisher()


class ChannelsBroadcaster:
    def __init__(self, thread: str | None = None) -> None:
        self.thread = thread
        self.log = event_log()

    def publish(self, run_id: str, event: dict[str, Any]) -> dict[str, Any] | None:
        """Stamp ``event`` with the next seq, buffer it for replay, and send it to the run's group
        (and its thread's). Returns the stamped event, or None if it could not be recorded."""
        try:
            stamped = self.log.append(run_id, {**event, "run_id": run_id})
        except Exception:
            logger.exception("could not record event %s of run %s", event.get("type"), run_id)
            return None
        message = {"type": "chamvi.event", "event": stamped}
        publisher.send(run_group(run_id), message)
        if self.thread:
            publisher.send(thread_group(self.thread), message)
        return stamped
