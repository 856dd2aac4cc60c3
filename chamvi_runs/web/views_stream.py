"""``GET chamvi/api/runs/<id>/stream/``: the run's events as Server-Sent Events.

The same events as the websocket, with the same replay rules (``replay.py``): ``?after=<seq>`` or
the ``Last-Event-ID`` header (ASCII digits, else a JSON 400) resumes after a seq; a seq ahead of
the server gets a restart, and the stream goes on from its marker's seq. Any web replica serves any
run, whichever process executes it.

A stream holds no database connection while it waits, so a web process serves as many streams as
it has sockets for. It follows the run's channel-layer group on a channel of its own, as a
websocket consumer does. It touches the database only to authorize the request, to replay what
the buffer cannot give, and to look at the run's status after a quiet minute, each time in a
worker thread whose connection is closed at once. The replay buffer is read to repair what the
layer lost (at most once, SPEC §8 wants exactly once): a live event after a gap makes the stream
send the missing ones first, and a quiet stream reads the buffer's tail now and then (the lost
event may be ``run.end``).

The stream opens with a comment line (daphne sends the headers with the first chunk), ends after
``run.end``, or when the run has settled (or is gone) and no ``run.end`` comes within
``SETTLE_GRACE_SECONDS``. A comment line goes out after ``KEEPALIVE_SECONDS`` of silence, so
proxies keep the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse

from ..core.numbers import ascii_int
from ..core.states import TERMINAL
from ..models import Run
from ..streaming.broadcast import events_of, publisher, run_group
from ..streaming.cursor import QUIET_SECONDS, Cursor, Reread
from ..streaming.events import RUN_END
from ..streaming.replay import missed_after, replay_for, settled_after
from .errors import ApiError
from .family import Family
from .socket_query import BadQuery, resume_of
from .views_api import _run_for, api_view

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
SETTLE_GRACE_SECONDS = 2.0
STATUS_SECONDS = 60.0
NO_LAYER_POLL_SECONDS = 0.25

T = TypeVar("T")


@api_view("GET")
def run_stream(request: HttpRequest, run_id: str) -> StreamingHttpResponse:
    run = _run_for(request, run_id)
    family = Family(run.pk)
    family.look(request.user)
    try:
        resume = resume_of({"resume": [request.GET.get("resume", "")]})
    except BadQuery as exc:
        raise ApiError(400, "invalid_field", str(exc)) from None
    response = StreamingHttpResponse(
        _events(run.pk, _after(request), family, request.user, resume), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _after(request: HttpRequest) -> int:
    """The seq to resume after: ``?after=`` first, else ``Last-Event-ID``, else 0. Only ASCII digits
    (core.numbers)."""
    sources = (("'after'", request.GET.get("after")), ("Last-Event-ID", request.headers.get("Last-Event-ID")))
    for name, raw in sources:
        if raw:
            seq = ascii_int(raw)
            if seq is None:
                message = f"{name} must be a seq: a non-negative integer in ASCII digits"
                raise ApiError(400, "invalid_field", message)
            return seq
    return 0


def _frame(event: dict[str, Any], run_id: str) -> str:
    # Only the stream's own run's events carry an id: a browser sends the last one back
    # (Last-Event-ID) as the seq to resume that run after. A child run's seq is its own.
    own = f"id: {event['seq']}\n" if event.get("run_id") == run_id else ""
    return f"{own}event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def _briefly(fn: Callable[..., T], *args: Any) -> T:
    """``fn`` in a worker thread whose database connection is closed when it returns."""

    def call() -> T:
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return await sync_to_async(call, thread_sensitive=False)()


def _opening(run_id: str, after: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None, bool]:
    """The replay after ``after``, the buffer's event at ``after`` (``replay.replay_for``), and
    whether the run had settled (or was gone) before it."""
    settled = _settled(run_id)
    return *replay_for(run_id, after), settled


def _read(reread: Reread) -> list[dict[str, Any]]:
    return missed_after(reread.run_id, reread.after, reread.sent)


def _settled(run_id: str) -> bool:
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    return status is None or status in TERMINAL


class _Follower:
    """The run's group on a channel of this stream's own; None from ``next`` when nothing came in
    time. A pending receive is kept across timeouts: cancelling one can lose a message."""

    def __init__(self, run_id: str) -> None:
        self.group = run_group(run_id)
        self.layer = get_channel_layer()
        self.channel = ""
        self.pending: asyncio.Future[Any] | None = None
        if isinstance(self.layer, InMemoryChannelLayer):
            # Executor threads must publish on this loop, the one the in-memory queues wake.
            publisher.use_loop()

    async def join(self) -> None:
        if self.layer is not None:
            if not self.channel:
                self.channel = await self.layer.new_channel()
            # Also renews the membership, which the layer expires (a day by default).
            await self.layer.group_add(self.group, self.channel)

    async def next(self, timeout: float) -> list[dict[str, Any]] | None:
        if self.layer is None:
            await asyncio.sleep(min(timeout, NO_LAYER_POLL_SECONDS))
            return None
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait({self.pending}, timeout=max(timeout, 0))
        if not done:
            return None
        pending, self.pending = self.pending, None
        try:
            message = pending.result()
        except Exception:
            # The layer failed (e.g. its Redis went away): the buffer repairs what this missed.
            logger.warning("SSE: could not receive from %s", self.group, exc_info=True)
            await asyncio.sleep(QUIET_SECONDS)
            return None
        return (events_of(message) or None) if isinstance(message, dict) else None

    async def leave(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
        if self.layer is not None and self.channel:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:  # the membership expires on its own
                logger.warning("SSE: could not leave %s", self.group, exc_info=True)


Render = Callable[[dict[str, Any], str], str]
"""What a stream sends for one event of the run it follows (``run_id``): ``_frame``'s SSE frame
of our vocabulary, or another protocol's frames (``chamvi_runs.agui``)."""


def _frames(events: list[dict[str, Any]], run_id: str, render: Render = _frame) -> list[str]:
    """The frames of ``events``, up to the end of ``run_id``: the stream ends there (a child run's
    end is one more event)."""
    frames = []
    for event in events:
        frames.append(render(event, run_id))
        if event.get("type") == RUN_END and event.get("run_id") == run_id:
            break
    return frames


async def _events(
    run_id: str,
    after: int,
    family: Family,
    viewer: Any,
    resume: dict[str, int],
    render: Render = _frame,
) -> AsyncIterator[str]:
    # The view's connection, opened in this request's thread, would stay open until the response
    # ends: close it now.
    await sync_to_async(connections.close_all)()
    # Servers send the headers with the first chunk: the client learns at once that it is connected.
    yield ": open\n\n"
    follower = _Follower(run_id)
    try:
        # Join first, then replay: an event published in between arrives twice and is skipped by seq.
        await follower.join()
        # Looked at again once joined: a child run started in between (its events, maybe its
        # approval, published before the join) is replayed too, not missed for good.
        await _briefly(family.look, viewer)
        loop = asyncio.get_running_loop()
        # What is sent, and what to read from the buffer (the websocket's rules: streaming/cursor.py).
        below = {child: resume.get(child, 0) for child, visible in family.below.items() if visible}
        cursor = Cursor({**below, run_id: after}, loop.time(), own=run_id)
        # The children first (after their seq in ``resume``): the stream ends with its own run.end.
        for child, child_after in below.items():
            replayed, held = await _briefly(replay_for, child, child_after)
            cursor.know(held)
            for frame in _frames(cursor.take(replayed), run_id, render):
                yield frame
        events, held, settled = await _briefly(_opening, run_id, after)
        cursor.know(held)
        for frame in _frames(cursor.take(events), run_id, render):
            yield frame
        now = loop.time()
        spoke = checked = now
        settled_at = now if settled else None
        while run_id in cursor.active:
            deadlines = [spoke + KEEPALIVE_SECONDS, cursor.quiet_until(), checked + STATUS_SECONDS]
            if settled_at is not None:
                deadlines.append(settled_at + SETTLE_GRACE_SECONDS)
            live = await follower.next(min(deadlines) - loop.time())
            now = loop.time()
            sent: list[dict[str, Any]] = []
            try:
                for event in live or []:
                    other = event.get("run_id", "")
                    if other != run_id:
                        # A child run's event: one started since the stream opened is looked up once.
                        shown = family.below.get(other)
                        if shown is None:
                            shown = await _briefly(family.shows, other, viewer)
                            if shown:
                                cursor.follow(other)
                        if not shown:
                            continue
                    reread = cursor.before_live(event)
                    if reread is not None:
                        sent += cursor.repaired(reread, await _briefly(_read, reread))
                    sent += cursor.take([event], now)
                # Live seqs below ours (the run's seqs were lost and start over) are not heard: the
                # quiet read finds the restart.
                if not sent and now >= cursor.quiet_until():
                    for reread in cursor.quiet_reads():
                        sent += cursor.repaired(reread, await _briefly(_read, reread))
                    cursor.read_quietly(now, len(sent))
                if settled_at is None and now >= checked + STATUS_SECONDS:
                    checked = now
                    settled_at = now if await _briefly(_settled, run_id) else None
            except Exception:  # Redis or the database hiccuped: try again at the next quiet time
                logger.warning("SSE: could not read run %s", run_id, exc_info=True)
            frames = _frames(sent, run_id, render)
            for frame in frames:
                yield frame
            if frames:
                spoke = now
            elif settled_at is not None and now >= settled_at + SETTLE_GRACE_SECONDS:
                # The settling process publishes run.end just after its commit; past this grace the
                # buffer has none (the process died or Redis refused it, or the run is gone): once
                # the run has been settled END_GRACE_SECONDS it gets one, and the client its end.
                try:
                    last = cursor.last[run_id]
                    ended = await _briefly(settled_after, run_id, last, cursor.sent.get(run_id))
                except Exception:  # Redis or the database hiccuped: the client reconnects
                    logger.warning("SSE: could not read run %s", run_id, exc_info=True)
                    return
                for frame in _frames(cursor.take(ended), run_id, render):
                    yield frame
                return
            elif now >= spoke + KEEPALIVE_SECONDS:
                spoke = now
                yield ": keepalive\n\n"
                try:
                    await follower.join()
                except Exception:
                    logger.warning("SSE: could not renew the membership of %s", follower.group, exc_info=True)
    finally:
        await follower.leave()
