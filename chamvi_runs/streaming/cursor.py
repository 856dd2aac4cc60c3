"""Exactly once over a layer that delivers at most once (SPEC §8): what a stream has sent of each run
it follows, and what it must read from the replay buffer before it sends more.

One algorithm for both transports, free of I/O: the websocket consumers (``web/consumers.py``, one
run or every run of a thread) and the Server-Sent Events view (``web/views_stream.py``, one run)
hand it the events they receive and the time, send what it returns, and make the reads it asks
for (``Reread``, answered by ``replay.missed_after``).

- Each run's events go out in seq order, each seq once: nothing at or below the seq sent last.
- A replay or a re-read that opens with a marker at or below the stream's seq is a *restart* (the
  client, or the stream, was ahead of the server, ``replay.py``): the stream goes on from the
  marker's seq.
- A live event past the next seq means the layer lost those in between (a *gap*): they are read
  from the buffer and sent first.
- A live event at the seq sent last that is another event means the run's seqs were lost and
  numbered again (Redis lost its data, or evicted the run's keys): the run is read again from its
  start (``replay.restart``). A stream that hears no live event (its group went with Redis's data)
  finds the same at its next quiet read, which compares the buffer's event at its seq with its own.
- A stream that stays quiet while a run it follows is active reads the buffer's tail (the lost
  event may be the last one, ``run.end``): after ``QUIET_SECONDS``, then twice as long each time
  nothing turns up, up to ``QUIET_MAX_SECONDS``, or ``QUIET_WAITING_SECONDS`` while every run it
  follows waits for a human (nothing happens until one decides, and the decision's events come).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .buffer.rules import MARKER
from .events import RUN_END, RUN_WAITING

QUIET_SECONDS = 1.0
QUIET_MAX_SECONDS = 4.0
QUIET_WAITING_SECONDS = 30.0


@dataclass(frozen=True)
class Reread:
    """A read of a run's buffered events after ``after`` the stream needs before it sends more.
    ``sent`` is the event it sent at ``after`` (None: none yet); a gap's ``before`` bounds what is
    missing: the live event at that seq comes next."""

    run_id: str
    after: int
    sent: dict[str, Any] | None
    before: int | None = None


class Cursor:
    """What a stream has sent of the runs it follows (run id -> seq, from ``after``), and when it
    reads the buffer next. ``now`` is the stream's clock (the event loop's time)."""

    def __init__(self, after: Mapping[str, int], now: float, own: str | None = None) -> None:
        self.own = own
        """The stream's own run, read last: its run.end ends the stream, after its children's events."""
        self.last: dict[str, int] = dict(after)
        self.sent: dict[str, dict[str, Any]] = {}  # run id -> the event sent at its last seq
        self.active: set[str] = set(after)  # runs whose run.end the stream has not sent
        self.waiting: set[str] = set()  # runs whose last event sent is run.waiting
        self.heard = now
        self.quiet = QUIET_SECONDS

    def follow(self, run_id: str) -> None:
        """Follow a run from its first event on (a run a thread socket learns of live)."""
        self.last.setdefault(run_id, 0)
        self.active.add(run_id)

    def unfollow(self, run_ids: Iterable[str]) -> None:
        """Stop reading the tails of runs whose every event has been sent (settled a while ago)."""
        self.active.difference_update(run_ids)

    # --- what to send -------------------------------------------------------------------------

    def know(self, held: dict[str, Any] | None) -> None:
        """The buffer's event at a run's seq as the stream opens (``replay.replay_for``): sent
        before, by another connection; what later reads compare with."""
        if held is not None and held.get("seq") == self.last.get(held.get("run_id", "")):
            self.sent.setdefault(held["run_id"], held)

    def take(self, events: list[dict[str, Any]], now: float | None = None) -> list[dict[str, Any]]:
        """Of ``events`` (of one run: live, replayed or re-read), those to send, in order. A restart
        goes on from its marker's seq. With ``now``, sending any counts as hearing from the run."""
        if events and events[0].get("type") == MARKER:
            run_id = events[0].get("run_id", "")
            if isinstance(events[0].get("seq"), int) and events[0]["seq"] <= self.last.get(run_id, 0):
                self.last[run_id] = events[0]["seq"] - 1
        out = [event for event in events if self._sends(event)]
        if out and now is not None:
            self.heard, self.quiet = now, QUIET_SECONDS
        return out

    def _sends(self, event: dict[str, Any]) -> bool:
        run_id, seq = event.get("run_id", ""), event.get("seq")
        if not isinstance(seq, int) or seq <= self.last.get(run_id, 0):
            return False
        self.last[run_id] = seq
        self.sent[run_id] = event
        kind = event.get("type")
        if kind == RUN_END:
            self.active.discard(run_id)
        if kind == RUN_WAITING:
            self.waiting.add(run_id)
        else:
            self.waiting.discard(run_id)
        return True

    def before_live(self, event: dict[str, Any]) -> Reread | None:
        """What to read before the live ``event`` can go out: the events a gap lost, or the run
        again when its seqs were numbered anew. None: ``take([event])`` now."""
        run_id, seq = event.get("run_id", ""), event.get("seq")
        if not isinstance(seq, int):
            return None
        last = self.last.get(run_id, 0)
        if seq > last + 1:
            return Reread(run_id, last, self.sent.get(run_id), before=seq)
        sent = self.sent.get(run_id)
        if seq == last and sent is not None and sent.get("type") != MARKER and event != sent:
            # The buffer holds this event there now: the re-read compares and restarts.
            return Reread(run_id, last, sent)
        return None

    def repaired(self, reread: Reread, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What a ``Reread``'s answer adds: a gap's events before its live event (all of them when
        the answer is a restart or a rebuild), or everything."""
        if reread.before is not None and not any(e.get("type") == MARKER for e in events):
            # Only the gap: an event after it that the layer also loses is counted at the next gap.
            events = [e for e in events if isinstance(e.get("seq"), int) and e["seq"] < reread.before]
        return self.take(events)

    # --- when to read the buffer's tail -------------------------------------------------------

    def quiet_until(self) -> float:
        """When the stream has been quiet long enough to read the buffer's tail."""
        return self.heard + self.quiet

    def quiet_reads(self) -> list[Reread]:
        """The reads of a quiet stream: the tail of every active run, after what was sent of it."""
        # The children in the order the stream learnt of them (children before theirs), its own
        # run last: a parent that ended while the stream was stalled ends it after their events.
        order = [r for r in self.last if r in self.active and r != self.own]
        order += [r for r in self.active if r not in self.last or r == self.own]
        return [Reread(run_id, self.last.get(run_id, 0), self.sent.get(run_id)) for run_id in order]

    def read_quietly(self, now: float, found: int) -> None:
        """After the quiet reads at ``now``, which found ``found`` events to send: read again soon
        when they found some, else wait longer."""
        # A run that is not waiting may go on at any moment, and its events may all be lost.
        ceiling = QUIET_WAITING_SECONDS if self.active <= self.waiting else QUIET_MAX_SECONDS
        self.heard = now
        self.quiet = QUIET_SECONDS if found else min(self.quiet * 2, ceiling)


def drops(reread: Reread, answer: list[dict[str, Any]], sent: list[dict[str, Any]]) -> dict[str, int]:
    """What a ``Reread`` repaired, for operators: ``gap`` and ``late`` count events sent from the
    buffer, ``rebuilt`` the times the buffer no longer held them (or the run's seqs were numbered
    anew) and the run was rebuilt from its stored steps, ``unrepaired`` events that were neither."""
    if any(e.get("type") == MARKER for e in answer):
        counts = {"rebuilt": 1}
    elif reread.before is not None:
        counts = {"gap": len(sent), "unrepaired": reread.before - reread.after - 1 - len(sent)}
    else:
        counts = {"late": len(sent)}
    return {kind: count for kind, count in counts.items() if count > 0}
