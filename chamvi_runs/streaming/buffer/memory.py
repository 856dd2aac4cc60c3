"""Embedded mode's buffer: the rules of the Redis store, held in this process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ..events import RUN_END
from .rules import BUFFER_BYTES, BUFFER_EVENTS, MAX_SEQ, Rebuild, Window, buffer_ttl, dropped, region


class _Held:
    __slots__ = ("bytes", "covers", "events", "expires", "sizes")

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []  # consecutive seqs, oldest first
        self.sizes: list[int] = []  # each event's JSON in bytes, as Redis would hold it
        self.bytes = 0
        self.expires = 0.0
        self.covers: tuple[int, int, str] | None = None  # the latest region: first seq, step, token

    def add(self, events: list[dict[str, Any]]) -> None:
        sizes = [len(json.dumps(event)) for event in events]
        self.events += events
        self.sizes += sizes
        self.bytes += sum(sizes)

    def trim(self, droppable: int, max_events: int, max_bytes: int) -> None:
        """Drop the oldest events, at most ``droppable``, while over either cap."""
        n = 0
        while n < droppable and (len(self.events) - n > max_events or self.bytes > max_bytes):
            self.bytes -= self.sizes[n]
            n += 1
        del self.events[:n], self.sizes[:n]


class MemoryEventLog:
    """Embedded mode's buffer, with the rules of ``RedisEventLog`` (expiry, caps, regions). The seq
    counters live as long as the process, the only one of embedded mode. ``clock`` is monotonic;
    ``max_events`` and ``max_bytes`` are a run's caps."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_events: int = BUFFER_EVENTS,
        max_bytes: int = BUFFER_BYTES,
    ) -> None:
        self.clock = clock
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._seq: dict[str, int] = {}

    def _live(self, run_id: str) -> _Held | None:
        now = self.clock()
        for gone in [r for r, held in self._held.items() if held.expires <= now]:
            del self._held[gone]
        return self._held.get(run_id)

    def append_many(self, items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | None]:
        with self._lock:
            return [self._append(run_id, event) for run_id, event in items]

    def _append(self, run_id: str, event: dict[str, Any], repair: bool = False) -> dict[str, Any] | None:
        held = self._live(run_id)
        if event.get("type") == RUN_END:
            # One per run: a repair (``end``) may have stored it before the settling process did.
            if held and held.events and held.events[-1].get("type") == RUN_END:
                return None
            if repair and not (held and held.events):
                return None
        held = held or self._held.setdefault(run_id, _Held())
        if dropped(event, held.covers):
            return None
        seq = self._seq[run_id] = self._top(run_id, held) + 1
        event = {**event, "seq": seq}
        held.add([event])
        held.trim(len(held.events) - 1, self.max_events, self.max_bytes)
        held.expires = self.clock() + buffer_ttl(event)
        return event

    def end(self, run_id: str, event: dict[str, Any]) -> dict[str, Any] | None:
        """As ``RedisEventLog.end``."""
        with self._lock:
            return self._append(run_id, event, repair=True)

    def lacking_end(self, run_ids: list[str]) -> list[str]:
        """As ``RedisEventLog.lacking_end``."""
        with self._lock:
            helds = [(run_id, self._live(run_id)) for run_id in run_ids]
            return [r for r, held in helds if held and held.events and held.events[-1].get("type") != RUN_END]

    def _top(self, run_id: str, held: _Held | None) -> int:
        return max(self._seq.get(run_id, 0), held.events[-1]["seq"] if held and held.events else 0)

    def window(self, run_id: str, after: int) -> Window:
        after = min(after, MAX_SEQ)
        with self._lock:
            held = self._live(run_id)
            top = self._top(run_id, held)
            events = held.events if held else []
            low = events[0]["seq"] if events else top + 1
            start = after
            if after < low - 1 and after < top:
                if held is None or held.covers is None or held.covers[0] < low:
                    return Window(top, None)
                start = held.covers[0] - 1
            return Window(top, events[max(start - low + 1, 0) :])

    def rebase(self, run_id: str, rebuild: Rebuild, after: int | None) -> list[dict[str, Any]]:
        """As ``RedisEventLog.rebase``."""
        with self._lock:
            held = self._live(run_id) or self._held.setdefault(run_id, _Held())
            top = self._top(run_id, held)
            low = held.events[0]["seq"] if held.events else top + 1
            if held.covers is not None and held.covers[0] >= low:
                return held.events[held.covers[0] - low :]
            if after is not None and top > 0 and not (after < low - 1 and after < top):
                return held.events[max(after - low + 1, 0) :]
            events = region(rebuild, held.events, top)
            before = len(held.events)
            held.add(events)
            held.covers = (top + 1, rebuild.step, rebuild.waiting)
            self._seq[run_id] = top + len(events)
            held.trim(before, self.max_events, self.max_bytes)  # never into the region
            held.expires = self.clock() + rebuild.ttl
            return events

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        """The held events after ``seq``, as they are (tests and tools)."""
        with self._lock:
            held = self._live(run_id)
            return [e for e in held.events if e["seq"] > seq] if held else []
