"""Publishing run events: each is recorded in the replay buffer (``buffer/``, which stamps its
``seq``), then sent to the channel layer groups of its run and thread. Deltas are disposable: a
failing channel layer never fails a run.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import signals
from ..conf import conf
from ..core import log_context
from ..core.log_context import LogContext
from .buffer import MemoryEventLog, RedisEventLog, event_log
from .events import DELTA

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 5.0

Item = tuple[Any, str, dict[str, Any], list[str], LogContext | None]
"""An event queued for the writer: its log, run id, event, groups, and the execution it came from
(named by what the writer logs about it)."""


def run_group(run_id: str) -> str:
    return f"chamvi.run.{run_id}"


def thread_group(thread: str, scope: str = "") -> str:
    """The group of the thread ``thread`` in ``scope`` (``models.Thread``). Group names allow only
    ASCII alphanumerics, hyphens, underscores and periods, under 100 characters: a hash. A global
    thread's is the hash of its name alone, as before threads had scopes (web processes of the
    previous release follow it during an upgrade); a scoped one's hashes the scope too, joined by a
    NUL, which neither may hold (``core.storable``)."""
    import hashlib

    key = f"{scope}\x00{thread}" if scope else thread
    return f"chamvi.thread.{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def message_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The channel layer message that carries ``events`` (of one batch, in seq order) to a group."""
    return {"type": "chamvi.event", "events": events}


def events_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events a ``chamvi.event`` message carries (one ``event`` from a worker of an older version)."""
    events = message.get("events")
    if isinstance(events, list):
        return [event for event in events if isinstance(event, dict)]
    event = message.get("event")
    return [event] if isinstance(event, dict) else []


async def _send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    # Different groups at once; one group's messages stay in order, batch by batch.
    results = await asyncio.gather(
        *(layer.group_send(group, message) for group, message in messages), return_exceptions=True
    )
    for (group, _), result in zip(messages, results, strict=True):
        if isinstance(result, BaseException):
            logger.warning("could not broadcast to %s", group, exc_info=result)


class Sends(NamedTuple):
    messages: list[tuple[str, dict[str, Any]]]
    done: threading.Event


class Publisher:
    """Sends to the channel layer from synchronous code, in order.

    The events writer delivers each batch on an event loop of its own thread (``deliver``):
    ``async_to_sync`` per event would open a loop (and a Redis connection) per delta. When the
    process also serves websockets from an in-memory layer, the server's own loop is used instead
    (``use_loop``), because that layer's queues belong to the loop the consumers wait on; sends are
    then handed over to that loop (``send``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Sends | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lent = False
        self._own: asyncio.AbstractEventLoop | None = None

    def use_loop(self) -> None:
        """Publish on the running loop from now on (call it from that loop: the ASGI server's)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._lent = True
            if self._loop is not loop:
                # Anything queued on a previous private loop is still delivered there.
                self._attach(loop)

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on ``loop``'s thread: a queue and the task that drains it, bound to that loop."""
        self._loop = loop
        self._queue = asyncio.Queue()
        # The loop keeps only a weak reference to its tasks.
        self._task = loop.create_task(self._drain(self._queue))

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        ready = threading.Event()

        def attach() -> None:
            self._attach(loop)
            ready.set()

        loop.call_soon_threadsafe(attach)
        ready.wait(5)

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="chamvi-publisher", daemon=True).start()
                self._start_on(loop)
            assert self._loop is not None
            return self._loop

    async def _drain(self, queue: asyncio.Queue[Sends | None]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            try:
                await _send_all(item.messages)
            finally:
                item.done.set()
                queue.task_done()

    def deliver(self, messages: list[tuple[str, dict[str, Any]]], timeout: float) -> bool:
        """Send each (group, message) and wait until the layer has taken them all; False: not
        within ``timeout``. For one calling thread (the events writer): unless a server's loop was
        lent (``use_loop``), the sends run on that thread's own event loop, with no hand-off to
        another thread and back for every batch."""
        with self._lock:
            lent = self._lent
        if lent:
            return self.send(messages).wait(timeout)
        if self._own is None:
            self._own = asyncio.new_event_loop()
        try:
            self._own.run_until_complete(asyncio.wait_for(_send_all(messages), timeout))
        except TimeoutError:
            return False
        return True

    def send(self, messages: list[tuple[str, dict[str, Any]]]) -> threading.Event:
        """Send each (group, message); the returned event is set once all were handed to the layer."""
        loop = self._ensure()
        queue = self._queue
        assert queue is not None
        item = Sends(messages, threading.Event())
        loop.call_soon_threadsafe(queue.put_nowait, item)
        return item.done

    def flush(self, timeout: float = 5) -> bool:
        """Wait until everything sent so far has been delivered to the layer's groups (a test that
        opens a socket next must not see those sends live). False: not within ``timeout``."""
        loop = self._ensure()
        queue = self._queue
        assert queue is not None
        done = threading.Event()

        async def delivered() -> None:
            await queue.join()
            done.set()

        # Scheduled after every put of the sends before it: the join waits for them.
        loop.call_soon_threadsafe(lambda: loop.create_task(delivered()))
        return done.wait(timeout)


publisher = Publisher()


class EventWriter:
    """Records events in the replay buffer and hands them to the publisher, off the caller's thread.

    An execution emits an event per delta; a Redis round trip each would dominate its time. One
    thread per process takes events in order and writes whatever has queued up in one pipeline.
    Order is kept per process, and a run has one executing process at a time, so seq order is
    emission order. ``flush`` waits until everything submitted so far is recorded and sent.
    """

    BATCH = 256

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(
        self, log: MemoryEventLog | RedisEventLog, run_id: str, event: dict[str, Any], groups: list[str]
    ) -> None:
        self._start()
        self._queue.put((log, run_id, event, groups, log_context.current()))

    def flush(self, timeout: float = 10) -> bool:
        self._start()
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="chamvi-events", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = self._gather(self._queue.get())
            self._write([item for item in batch if isinstance(item, tuple)])
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()

    def _gather(self, first: Any) -> list[Any]:
        """``first`` and what follows it: everything queued, and while the latest is a delta, what
        arrives within ``STREAM_COALESCE_SECONDS`` of ``first``. A model streams deltas of a few
        characters each; merged, they cost one buffered and one sent event instead of dozens, and
        a client renders the same text (a flush, or any other event, ends the wait at once)."""
        batch = [first]
        deadline = time.monotonic() + conf.STREAM_COALESCE_SECONDS
        while len(batch) < self.BATCH:
            try:
                latest = batch[-1]
                left = deadline - time.monotonic()
                if isinstance(latest, tuple) and latest[2].get("type") == DELTA and left > 0:
                    batch.append(self._queue.get(timeout=left))
                else:
                    batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write(self, items: list[Item]) -> None:
        # What is logged about a batch of one execution's events names that execution.
        contexts = {item[4] for item in items}
        with log_context.bound(contexts.pop() if len(contexts) == 1 else None):
            self._write_batch(_coalesce(items))

    def _write_batch(self, items: list[Item]) -> None:
        sent = 0
        outgoing: dict[str, list[dict[str, Any]]] = {}
        # Consecutive items of one log go out in one batch; logs differ only when settings change.
        start = 0
        while start < len(items):
            end = start
            while end < len(items) and items[end][0] is items[start][0]:
                end += 1
            chunk = items[start:end]
            try:
                stamped = chunk[0][0].append_many([(item[1], item[2]) for item in chunk])
            except Exception:
                logger.exception("could not record %d events", len(chunk))
                stamped = []
            for event, item in zip(stamped, chunk, strict=False):
                if event is None:
                    continue  # a region already holds it
                sent += 1
                for group in item[3]:
                    outgoing.setdefault(group, []).append(event)
            start = end
        if outgoing:
            # Wait for the layer before the next batch: while it is slow, the deltas queued here
            # meanwhile go out merged, so a busy process sends fewer, larger events instead of
            # falling behind. Every event is in the replay buffer already: a layer that does not
            # answer in time costs live delivery, which clients repair from the buffer.
            messages = [(group, message_of(events)) for group, events in outgoing.items()]
            if not publisher.deliver(messages, PUBLISH_TIMEOUT):
                logger.warning("the channel layer took over %s s to take a batch of events", PUBLISH_TIMEOUT)
        if sent:
            signals.events_sent.send(EventWriter, count=sent)


def _coalesce(items: list[Item]) -> list[Item]:
    """Merge each delta into the run's previous item of the batch when that is a delta of the same
    step, attempt and kind. A run's events keep their order (seq is per run); other runs' events
    in between do not matter. When the model streams faster than events are published, clients get
    fewer, larger deltas; their text still concatenates to the step's text, in order."""
    merged: list[Item | None] = []
    latest: dict[tuple[int, str], int] = {}  # (log, run) -> index in merged of its latest item
    for item in items:
        log, run_id, event = item[:3]
        key = (id(log), run_id)
        at = latest.get(key)
        previous = merged[at] if at is not None else None
        if (
            at is not None
            and previous is not None
            and event.get("type") == DELTA
            and previous[2].get("type") == DELTA
            and all(previous[2].get(k) == event.get(k) for k in ("step", "attempt", "kind"))
        ):
            text = previous[2]["text"] + event["text"]
            # Moved to the end: the merged delta goes out where its last part would have.
            merged[at] = None
            item = (log, run_id, {**previous[2], "text": text}, *item[3:])
        latest[key] = len(merged)
        merged.append(item)
    return [item for item in merged if item is not None]


writer = EventWriter()


class ChannelsBroadcaster:
    """Publishes a run's events to its group and, for a run of a thread, the thread's (``thread``
    in ``scope``: the run's own ``thread`` and ``scope``). A child run's (SPEC §13) also go to the
    groups of the runs above it, ``ancestors`` (nearest first), and ``thread`` is its topmost
    ancestor's: whoever follows a parent sees its children; each event names its
    ``parent_run_id``."""

    def __init__(self, thread: str | None = None, scope: str = "", ancestors: Sequence[str] = ()) -> None:
        self.thread = thread
        self.scope = scope
        self.ancestors = list(ancestors)
        self.log = event_log()
        self._groups: dict[str, list[str]] = {}

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        """Queue ``event`` to be stamped with the run's next seq, buffered for replay, and sent to the
        groups of the run and its thread. Never raises: events are not worth failing a run."""
        groups = self._groups.get(run_id)
        if groups is None:  # named once per run, not hashed again for every delta
            groups = [run_group(run_id), *(run_group(a) for a in self.ancestors)]
            if self.thread:
                groups.append(thread_group(self.thread, self.scope))
            self._groups[run_id] = groups
        if self.ancestors:
            event = {**event, "parent_run_id": self.ancestors[0]}
        writer.submit(self.log, run_id, {**event, "run_id": run_id}, groups)

    def flush(self) -> None:
        """Wait until the events published so far are in the replay buffer and with the layer."""
        writer.flush()
