"""Embedded mode's replay buffer: the rules of ``buffer.py`` kept in this process's memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .buffer import BUFFER_EVENTS, Rebuild, Window, buffer_ttl, dropped, region


class _Held:
    __slots__ = ("covers", "events", "expires")

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []  # consecutive seqs, oldest first
        self.expires = 0.0
        self.covers: tuple[int, int, str] | None = None  # the latest region: first seq, step, token


class MemoryEventLog:
    """Embedded mode's buffer, with the rules of ``RedisEventLog`` (expiry, cap, regions). The seq
    counters live as long as the process, the only one of embedded mode. ``clock`` is monotonic."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
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
        if event.get("type") == "run.end":
            # One per run: a repair (``end``) may have stored it before the settling process did.
            if held and held.events and held.events[-1].get("type") == "run.end":
                return None
            if repair and not (held and held.events):
                return None
        held = held or self._held.setdefault(run_id, _Held())
        if dropped(event, held.covers):
            return None
        seq = self._seq[run_id] = self._top(run_id, held) + 1
        event = {**event, "seq": seq}
        held.events.append(event)
        del held.events[: max(len(held.events) - BUFFER_EVENTS, 0)]
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
            return [
                r for r, held in helds if held and held.events and held.events[-1].get("type") != "run.end"
            ]

    def _top(self, run_id: str, held: _Held | None) -> int:
        return max(self._seq.get(run_id, 0), held.events[-1]["seq"] if held and held.events else 0)

    def window(self, run_id: str, after: int) -> Window:
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

    def rebase(self, run_id: str, rebuild: Rebuild, after: int) -> list[dict[str, Any]]:
        """As ``RedisEventLog.rebase``."""
        with self._lock:
            held = self._live(run_id) or self._held.setdefault(run_id, _Held())
            top = self._top(run_id, held)
            low = held.events[0]["seq"] if held.events else top + 1
            ahead = after > top
            if held.covers is not None and held.covers[0] >= low and not ahead:
                return held.events[held.covers[0] - low :]
            if top > 0 and not ahead and not (after < low - 1 and after < top):
                return held.events[max(after - low + 1, 0) :]
            base = max(top, after)
            events = region(rebuild, held.events, base)
            if ahead:
                # The held events are older than the region, which carries what it needs of them.
                held.events, low = [], base + 1
            held.events.extend(events)
            held.covers = (base + 1, rebuild.step, rebuild.waiting)
            self._seq[run_id] = base + len(events)
            # Trimmed to the cap, never into the region.
            del held.events[: min(max(len(held.events) - BUFFER_EVENTS, 0), base + 1 - low)]
            held.expires = self.clock() + rebuild.ttl
            return events

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        """The held events after ``seq``, as they are (tests and tools)."""
        with self._lock:
            held = self._live(run_id)
            return [e for e in held.events if e["seq"] > seq] if held else []


memory_log = MemoryEventLog()
