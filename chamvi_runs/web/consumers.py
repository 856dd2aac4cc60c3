"""Websocket consumers (SPEC §8): one run here, every run of a thread in ``thread_consumer.py``.

Authentication is the handshake's (``socket_auth.py``: the session, or an API token offered as a
subprotocol, echoed as ``chamvi``; a refused token is closed with 4401). Authorization happens in
``connect()``: a user who may not watch is accepted and closed at once with 4403, before any group
is joined. A ``?after=`` that is not a seq in ASCII digits gets an ``invalid_after`` error and a
close with 4400. Events replay from the buffer after ``?after=<seq>``, then arrive live from the
group; a seq ahead of the server gets a restart (``replay.py``), and the socket goes on from its
marker's seq. A thread socket replays the latest ``THREAD_REPLAY_RUNS`` runs of its thread, and the
runs its client names in ``resume`` (``socket_query.py``), each after the seq the client has of
it; older runs send live events only.

Delivery: the channel layer is at most once (channels-redis silently drops a group message for a web
process whose sockets are over the layer's capacity) and the contract is exactly once. Every event is
in the replay buffer before it is sent to the layer, and carries its run's ``seq``, so a socket
repairs what the layer lost: a live event after a gap makes it send the missing events from the
buffer first (``gap``), and a stream that stays quiet while its run is active makes it read the
buffer's tail (``late``: the lost event may be the last one, ``run.end``): after ``QUIET_SECONDS``,
then less and less often, every ``QUIET_MAX_SECONDS`` at the least (``QUIET_WAITING_SECONDS`` while
every run it follows waits for approval). At its first quiet check once ``STATUS_SECONDS`` have
passed since the last (and when it connects), it also asks the database whether its runs settled:
a ``run.end`` that never reached the buffer (the settling process died, or Redis refused the batch)
is stored then (``replay.end_lost``) and sent like any late event, and runs settled a while ago are
watched no more. A socket sends each run's events in seq order and skips what it has already sent.
Every repair is logged (a warning) and counted: ``DROPS`` in this process, and the hash
``chamvi:stream:drops`` in the queue's Redis for every web process (``redis-cli HGETALL
chamvi:stream:drops``): ``gap`` and ``late`` count events sent from the buffer,
``rebuilt`` the times the buffer no longer held them and the run was rebuilt from its stored steps
(``replay.py``), ``unrepaired`` events that were neither.

Client messages (``input``, ``cancel``, ``approve``, ``deny``) are answered by
``socket_commands.py``, with the same policy as the HTTP API, for the user as they are now: each
command, and every ``SESSION_SECONDS`` the socket, asks ``socket_auth.current_user``. A session or
token that no longer authenticates gets ``unauthenticated`` and close 4401; a user who may no longer
watch, ``not_found`` and 4403.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth.models import AnonymousUser
from django.db import close_old_connections

from ..conf import conf
from ..models import Run
from ..policy import policy
from ..streaming.broadcast import events_of, run_group
from ..streaming.buffer import MARKER
from ..streaming.replay import end_lost, missed_after, replay_after, restarts
from .socket_auth import current_user, refused_token, subprotocol
from .socket_commands import MAX_DEPTH, answer, error, malformed
from .socket_query import BadQuery, after_of, query_of

logger = logging.getLogger(__name__)

FORBIDDEN = 4403
BAD_REQUEST = 4400
UNAUTHENTICATED = 4401
THREAD_REPLAY_RUNS = 50
QUIET_SECONDS = 1.0
QUIET_MAX_SECONDS = 4.0
QUIET_WAITING_SECONDS = 30.0
# How often a quiet socket asks the database whether its active runs settled.
STATUS_SECONDS = 60.0
# How often a socket asks whether its session (or token) still authenticates its user, who may still
# watch: 5 indexed queries (session, user, run, the user's permissions) a minute per socket, 3
# for the run's creator; a logged-out page stops seeing the run within a minute.
SESSION_SECONDS = 60.0
DROPS_KEY = "chamvi:stream:drops"
DROPS: Counter[str] = Counter()
T = TypeVar("T")


def _in_thread(fn: Any) -> Any:
    # Off the thread that serves every ``database_sync_to_async`` call of the process (sessions,
    # authorization): a socket repairing its stream must not hold up the others.
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            # Here, inside the context asgiref runs the call in: the close_old_connections() that
            # DatabaseSyncToAsync runs around it, outside that context, does not see a connection
            # opened here (asgiref 3.13), which stayed open as long as the socket.
            close_old_connections()

    return DatabaseSyncToAsync(call, thread_sensitive=False)


async def _count(kind: str, count: int) -> None:
    DROPS[kind] += count
    if conf.EXECUTOR == "rq":
        await _in_thread(_count_in_redis)(kind, count)


def _count_in_redis(kind: str, count: int) -> None:
    import django_rq

    try:
        django_rq.get_connection(conf.QUEUE).hincrby(DROPS_KEY, kind, count)
    except Exception:  # the counter is for operators; failing to count must not end a stream
        logger.warning("could not count %d %s events in %s", count, kind, DROPS_KEY, exc_info=True)


class RunConsumer(AsyncJsonWebsocketConsumer):
    """``ws/chamvi/runs/<run_id>/``: the events of one run."""

    async def connect(self) -> None:
        if not await self._accepted():
            return
        self.run_id: str = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(self._can_view)(self.run_id):
            await self.close(code=FORBIDDEN)
            return
        after = await self._after()
        if after is None:
            return
        await self._open([run_group(self.run_id)], after)

    async def _accepted(self) -> bool:
        """Accept the handshake; a token the handshake refused is closed at once with 4401."""
        self.allowed = False
        await self.accept(subprotocol=subprotocol(self.scope))
        if refused_token(self.scope):
            await self.close(code=UNAUTHENTICATED)
            return False
        self.viewer = self.user
        return True

    @property
    def user(self) -> Any:
        """The user the socket connected as (``viewer``: as the latest check found it)."""
        return self.scope.get("user") or AnonymousUser()

    def _can_view(self, run_id: str) -> bool:
        run = Run.objects.filter(pk=run_id).first()
        return run is not None and bool(policy().can_view(self.viewer, run))

    def _watchable(self) -> bool:
        return self._can_view(self.run_id)

    def _recheck(self) -> int | None:
        """Who the socket's user is now (``viewer``); the close code for a socket it must not keep."""
        fresh = current_user(self.scope)
        if self.user.is_authenticated and (not fresh.is_authenticated or fresh.pk != self.user.pk):
            return UNAUTHENTICATED
        self.viewer = fresh
        return None if self._watchable() else FORBIDDEN

    async def _after(self) -> dict[str, int] | None:
        """The seq to replay after of this socket's run, or None for a query whose ``after`` is not a
        seq: the client is told, and the socket closed."""
        return await self._query(lambda query: {self.run_id: after_of(query)})

    async def _query(self, read: Callable[[dict[str, list[str]]], T]) -> T | None:
        try:
            return read(query_of(self.scope))
        except BadQuery as exc:
            await self.send_json(error("invalid_after", str(exc)))
            await self.close(code=BAD_REQUEST)
            return None

    async def _open(self, groups: list[str], after: dict[str, int]) -> None:
        """Join ``groups``, replay the runs of ``after`` (run id -> seq), then watch for lost events."""
        # Nothing at or before ``after`` is sent, live or replayed, but a restart (``_send_replayed``).
        self.last_seq: dict[str, int] = dict(after)
        self.active: set[str] = set(after)  # runs whose run.end this socket has not sent
        self.waiting: set[str] = set()  # runs whose last event this socket sent is run.waiting
        self.lock = asyncio.Lock()
        # Join first, then replay: an event published in between arrives twice and is skipped by seq.
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups = list(groups)
        self.allowed = True
        settled = await _in_thread(end_lost)(list(after))
        for run_id in after:
            await self._send_replayed(run_id, await _in_thread(replay_after)(run_id, self.last_seq[run_id]))
        # Settled a while ago, their end in the buffer: the replay sent what they will ever have (a
        # client that names a run at its end gets nothing, and must not be watched for more).
        self.active -= settled
        self.quiet = QUIET_SECONDS
        self.heard = self.checked = self.rechecked = asyncio.get_running_loop().time()
        self.watchdog = asyncio.ensure_future(self._watch())

    async def disconnect(self, code: int) -> None:
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None:
            watchdog.cancel()

    # --- delivery -----------------------------------------------------------------------------

    async def _send_replayed(self, run_id: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send what a replay or a repair brought; the events sent. A restart (the client, or this
        socket, was ahead of the server) goes on from its marker's seq, which is at or below ours."""
        if restarts(events, self.last_seq.get(run_id, 0)):
            self.last_seq[run_id] = events[0]["seq"] - 1
        return [e for e in events if await self._send_event(e)]

    async def _send_event(self, event: dict[str, Any]) -> bool:
        """Send ``event`` unless this socket has sent its seq (or a later one) of its run."""
        run_id = event.get("run_id", "")
        seq = event.get("seq")
        if not isinstance(seq, int) or seq <= self.last_seq.get(run_id, 0):
            return False
        self.last_seq[run_id] = seq
        if event.get("type") == "run.end":
            self.active.discard(run_id)
        if event.get("type") == "run.waiting":
            self.waiting.add(run_id)
        else:
            self.waiting.discard(run_id)
        await self.send_json(event)
        return True

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        for event in events_of(message):
            await self._deliver(event)

    async def _deliver(self, event: dict[str, Any]) -> None:
        """A live event: first what the layer lost before it, if anything."""
        run_id, seq = event.get("run_id", ""), event.get("seq")
        async with self.lock:
            if isinstance(seq, int) and seq > self.last_seq.get(run_id, 0) + 1:
                try:
                    await self._repair(run_id, before=seq)
                except Exception:
                    # Sending it now would leave the gap for good: the next live event or the quiet
                    # check fills the gap and sends this one from the buffer.
                    logger.warning("run %s: could not fill a gap before seq %d", run_id, seq, exc_info=True)
                    return
            # Only what is sent counts as heard: live seqs below ours (the run's seqs were lost and
            # start over) leave the quiet check to find the restart.
            if await self._send_event(event):
                self.heard, self.quiet = asyncio.get_running_loop().time(), QUIET_SECONDS

    async def _repair(self, run_id: str, before: int | None = None) -> int:
        """Send the run's buffered events this socket has not sent: those before ``before`` were
        lost by the layer (a gap); without ``before``, those the layer did not deliver in time.
        Returns how many events it sent."""
        last = self.last_seq.get(run_id, 0)
        events = await _in_thread(missed_after)(run_id, last)
        rebuilt = any(e.get("type") == MARKER for e in events)
        if before is not None and not rebuilt:
            # Only the gap: an event after it that the layer also loses is counted at the next gap.
            events = [e for e in events if e["seq"] < before]
        sent = await self._send_replayed(run_id, events)
        if rebuilt:
            # The buffer no longer held them: the run was rebuilt from its steps (replay.py), and
            # the client told so by the marker.
            counts = {"rebuilt": 1}
        else:
            unrepaired = before - last - 1 - len(sent) if before is not None else 0
            counts = {"gap" if before else "late": len(sent), "unrepaired": unrepaired}
        counts = {kind: count for kind, count in counts.items() if count > 0}
        for kind, count in counts.items():
            await _count(kind, count)
        if counts:
            logger.warning(
                "run %s: the channel layer did not deliver events after seq %d: %s", run_id, last, counts
            )
        return len(sent)

    async def _watch(self) -> None:
        """Read the buffer's tail of active runs whenever the stream has been quiet for a while: less
        and less often while nothing turns up."""
        loop = asyncio.get_running_loop()
        while True:
            if loop.time() >= self.rechecked + SESSION_SECONDS:
                self.rechecked = loop.time()
                try:
                    code = await _in_thread(self._recheck)()
                except Exception:  # a database hiccup: ask again at the next check
                    logger.warning("could not check a socket's user", exc_info=True)
                    code = None
                if code is not None:
                    await self.close(code=code)
                    return
            wait = min(self.heard + self.quiet, self.rechecked + SESSION_SECONDS) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            async with self.lock:
                found = 0
                settled: set[str] = set()
                if self.active and loop.time() >= self.checked + STATUS_SECONDS:
                    self.checked = loop.time()
                    try:
                        # A run.end may never have reached the buffer: the repair below reads it.
                        settled = await _in_thread(end_lost)(sorted(self.active))
                    except Exception:  # a Redis or database hiccup: the repairs go on
                        logger.warning("could not look for runs that settled", exc_info=True)
                try:
                    for run_id in sorted(self.active):
                        found += await self._repair(run_id)
                    self.active -= settled
                except Exception:  # a Redis or database hiccup: try again at the next quiet time
                    logger.warning("could not read the replay buffer", exc_info=True)
                self.heard = loop.time()
                # A run that is not waiting may go on at any moment, and its events may all be lost.
                ceiling = QUIET_WAITING_SECONDS if self.active <= self.waiting else QUIET_MAX_SECONDS
                self.quiet = QUIET_SECONDS if found else min(self.quiet * 2, ceiling)

    # --- client -> server ---------------------------------------------------------------------

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if not getattr(self, "allowed", False):
            return
        if text_data is None:
            await self.send_json(error("invalid_message", "send JSON in text frames"))
            return
        try:
            content = await self.decode_json(text_data)
        except RecursionError:
            await self.send_json(error("invalid_message", f"nest the message at most {MAX_DEPTH} deep"))
            return
        except ValueError:
            await self.send_json(error("invalid_message", "the message is not JSON"))
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        reply, code = malformed(content), None
        if reply is None:
            reply, code = await database_sync_to_async(self._command)(content)
        await self.send_json(reply)
        if code is not None:
            await self.close(code=code)

    def _command(self, content: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """The reply to a command from the socket's user as they are now, and the close code of a
        socket that user may no longer keep."""
        try:
            code = self._recheck()
        except Exception:  # as answer() does with a command that fails unexpectedly
            logger.exception("could not check a socket's user")
            return error("internal_error", "the command failed"), None
        if code == UNAUTHENTICATED:
            return error("unauthenticated", "the session has ended: log in again"), code
        if code == FORBIDDEN:
            return error("not_found", "you may no longer view this"), code
        return answer(self.viewer, content, self._target, self._shows), None

    def _target(self, content: dict[str, Any]) -> Run | None:
        """The run a steering message is for: this socket's run (naming another one is refused)."""
        if content.get("run_id", self.run_id) != self.run_id:
            return None
        return Run.objects.filter(pk=self.run_id).first()

    def _covers(self, run: Run) -> bool:
        return run.pk == self.run_id

    def _shows(self, run: Run) -> bool:
        return self._covers(run) and bool(policy().can_view(self.viewer, run))
