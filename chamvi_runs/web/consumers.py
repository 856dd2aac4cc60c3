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
repairs what the layer lost, by the rules of ``streaming/cursor.py`` (shared with the SSE view): a
gap is filled from the buffer, a quiet socket reads the buffer's tail now and then, and a run whose
seqs were numbered anew is sent again from its start. At its first quiet read once
``STATUS_SECONDS`` have passed since the last (and when it connects), a socket also asks the
database whether its runs settled: a ``run.end`` that never reached the buffer (the settling process
died, or Redis refused the batch) is stored then (``replay.end_lost``) and sent like any late event,
and runs settled a while ago are watched no more. Every repair is logged (a warning) and counted:
``DROPS`` in this process, and the hash ``chamvi:stream:drops`` in the queue's Redis for every web
process (``redis-cli HGETALL chamvi:stream:drops``), by the kinds of ``cursor.drops``.

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

from .. import store
from ..models import Run
from ..modes import mode
from ..policy import policy
from ..streaming.broadcast import events_of, run_group
from ..streaming.cursor import Cursor, Reread, drops
from ..streaming.replay import end_lost, missed_after, replay_for
from .family import Family
from .socket_auth import current_user, refused_token, subprotocol
from .socket_commands import MAX_DEPTH, answer, error, malformed
from .socket_query import BadQuery, after_of, query_of, resume_of

logger = logging.getLogger(__name__)

FORBIDDEN = 4403
BAD_REQUEST = 4400
UNAUTHENTICATED = 4401
THREAD_REPLAY_RUNS = 50
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
    await _in_thread(mode().count_drops)(DROPS_KEY, kind, count)


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
        await self._open([run_group(self.run_id)], after, own=self.run_id)

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
        """The seq to replay after of this socket's run and of the runs below it (its child runs,
        SPEC §13: after their ``resume`` seq, else from their start), or None for a query whose
        ``after`` or ``resume`` is not valid: the client is told, and the socket closed."""
        seqs = await self._query(lambda query: (after_of(query), resume_of(query)))
        if seqs is None:
            return None
        after, resume = seqs
        self.family = Family(self.run_id)
        below = await database_sync_to_async(self.family.look)(self.viewer)
        # The children first, as the event stream's (views_stream.py): ``_open`` replays in this
        # order, and a parent that went on while the socket opened may have ended by its replay's
        # read; its run.end must come after its children's events, not before them.
        return {**{run_id: resume.get(run_id, 0) for run_id in below}, self.run_id: after}

    async def _query(self, read: Callable[[dict[str, list[str]]], T]) -> T | None:
        try:
            return read(query_of(self.scope))
        except BadQuery as exc:
            await self.send_json(error("invalid_after", str(exc)))
            await self.close(code=BAD_REQUEST)
            return None

    async def _open(self, groups: list[str], after: dict[str, int], own: str | None = None) -> None:
        """Join ``groups``, replay the runs of ``after`` (run id -> seq), then watch for lost events.
        ``own``: the socket's run, whose children come before it (a thread's socket has none)."""
        loop = asyncio.get_running_loop()
        # Nothing at or before ``after`` is sent, live or replayed, but a restart.
        self.cursor = Cursor(after, loop.time(), own=own)
        self.lock = asyncio.Lock()
        # Join first, then replay: an event published in between arrives twice and is skipped by seq.
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups = list(groups)
        family: Family | None = getattr(self, "family", None)
        if family is not None:
            # Looked at again once joined: a child run started in between (its events, maybe its
            # approval, published before the join) is replayed too, not missed for good.
            known = set(after)
            started = [r for r in await database_sync_to_async(family.look)(self.viewer) if r not in known]
            after = {**dict.fromkeys(started, 0), **after}
            for run_id in started:
                self.cursor.follow(run_id)
        self.allowed = True
        settled = await _in_thread(end_lost)(list(after))
        for run_id in after:
            replayed, held = await _in_thread(replay_for)(run_id, self.cursor.last[run_id])
            self.cursor.know(held)
            await self._send_all(self.cursor.take(replayed))
        # Settled a while ago, their end in the buffer: the replay sent what they will ever have (a
        # client that names a run at its end gets nothing, and must not be watched for more).
        self.cursor.unfollow(settled)
        self.checked = self.rechecked = loop.time()
        self.watchdog = asyncio.ensure_future(self._watch())

    async def disconnect(self, code: int) -> None:
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None:
            watchdog.cancel()

    # --- delivery (the rules are the cursor's: streaming/cursor.py) ---------------------------

    async def _send_all(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            await self.send_json(event)

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        for event in events_of(message):
            run_id = event.get("run_id", "")
            if run_id != self.run_id:
                # A child run's event (its parent_run_id names this run or one below it): one
                # started after this socket connected is looked up once.
                shown = self.family.below.get(run_id)
                if shown is None:
                    shown = await database_sync_to_async(self.family.shows)(run_id, self.viewer)
                    if shown:
                        self.cursor.follow(run_id)
                if not shown:
                    continue
            await self._deliver(event)

    async def _deliver(self, event: dict[str, Any]) -> None:
        """A live event: first what the layer lost before it, if anything."""
        async with self.lock:
            reread = self.cursor.before_live(event)
            if reread is not None:
                try:
                    await self._repair(reread)
                except Exception:
                    # Sending it now would leave the gap for good: the next live event or the quiet
                    # check fills the gap and sends this one from the buffer.
                    logger.warning(
                        "run %s: could not repair before seq %s",
                        reread.run_id,
                        event.get("seq"),
                        exc_info=True,
                    )
                    return
            # Only what is sent counts as heard: live seqs below ours (the run's seqs were lost and
            # start over) leave the quiet check to find the restart.
            await self._send_all(self.cursor.take([event], asyncio.get_running_loop().time()))

    async def _repair(self, reread: Reread) -> int:
        """Send what ``reread`` finds in the buffer that this socket has not sent: what the layer
        lost, or the run again from its start. Returns how many events it sent."""
        answer = await _in_thread(missed_after)(reread.run_id, reread.after, reread.sent)
        sent = self.cursor.repaired(reread, answer)
        await self._send_all(sent)
        counts = drops(reread, answer, sent)
        for kind, count in counts.items():
            await _count(kind, count)
        if counts:
            logger.warning(
                "run %s: the channel layer did not deliver events after seq %d: %s",
                reread.run_id,
                reread.after,
                counts,
            )
        return len(sent)

    async def _watch(self) -> None:
        """Read the buffer's tail of active runs whenever the stream has been quiet for a while: less
        and less often while nothing turns up."""
        loop = asyncio.get_running_loop()
        cursor = self.cursor
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
            wait = min(cursor.quiet_until(), self.rechecked + SESSION_SECONDS) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            async with self.lock:
                found = 0
                settled: set[str] = set()
                if cursor.active and loop.time() >= self.checked + STATUS_SECONDS:
                    self.checked = loop.time()
                    try:
                        # A run.end may never have reached the buffer: the repair below reads it.
                        settled = await _in_thread(end_lost)(sorted(cursor.active))
                    except Exception:  # a Redis or database hiccup: the repairs go on
                        logger.warning("could not look for runs that settled", exc_info=True)
                try:
                    for reread in cursor.quiet_reads():
                        found += await self._repair(reread)
                    cursor.unfollow(settled)
                except Exception:  # a Redis or database hiccup: try again at the next quiet time
                    logger.warning("could not read the replay buffer", exc_info=True)
                cursor.read_quietly(loop.time(), found)

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
        # A child run's approvals and questions are decided from its parent's socket too.
        return run.pk == self.run_id or store.is_below(run, self.run_id)

    def _shows(self, run: Run) -> bool:
        return self._covers(run) and bool(policy().can_view(self.viewer, run))
