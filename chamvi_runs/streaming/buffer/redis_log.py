"""The buffer in Redis, shared by every process: one Lua script per operation (``lua/``)."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import redis

from ..events import RUN_END
from .rules import BUFFER_BYTES, BUFFER_EVENTS, MAX_SEQ, SEQ_TTL, Rebuild, Window, buffer_ttl, cover


def _lua(*names: str) -> str:
    """The scripts ``names`` of ``lua/``, one after the other (package data, so a wheel has them)."""
    folder = files("chamvi_runs.streaming.buffer") / "lua"
    return "".join((folder / f"{name}.lua").read_text(encoding="utf-8") for name in names)


class RedisEventLog:
    """Per run: ``chamvi:seq:<id>`` (the counter), ``chamvi:events:<id>`` (a sorted set of the
    events' JSON, scored by seq), ``chamvi:region:<id>`` (the latest region: seq, step, waiting) and
    ``chamvi:bytes:<id>`` (the bytes the events hold, for the caps). Each operation is one Lua
    script, so seq order is buffer order and a region is placed atomically among concurrent appends.
    ``max_events`` and ``max_bytes`` are a run's caps."""

    APPEND = _lua("trim", "append")
    WINDOW = _lua("window")
    REBASE = _lua("trim", "rebase")

    def __init__(
        self, connection: Any, *, max_events: int = BUFFER_EVENTS, max_bytes: int = BUFFER_BYTES
    ) -> None:
        self.connection = connection
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._append = connection.register_script(self.APPEND)
        self._window = connection.register_script(self.WINDOW)
        self._rebase = connection.register_script(self.REBASE)

    @staticmethod
    def _keys(run_id: str) -> list[str]:
        return [
            f"chamvi:seq:{run_id}",
            f"chamvi:events:{run_id}",
            f"chamvi:region:{run_id}",
            f"chamvi:bytes:{run_id}",
        ]

    def _append_args(self, event: dict[str, Any], step: int, token: str, once: str) -> list[Any]:
        ttl = buffer_ttl(event)
        return [json.dumps(event), ttl, max(ttl, SEQ_TTL), self.max_events, step, token, once, self.max_bytes]

    def append_many(self, items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | None]:
        """Append a batch in one round trip (a pipeline of script calls, run in order). None for an
        event a region already holds."""
        calls = []
        for run_id, event in items:
            once = "end" if event.get("type") == RUN_END else ""
            calls.append([*self._keys(run_id), *self._append_args(event, *cover(event), once)])
        # EVALSHA straight into the pipeline: a pipeline of registered scripts first asks Redis
        # whether they exist (SCRIPT EXISTS), a second round trip for every batch. A Redis that lost
        # the script (a restart) refuses every call of the batch, so loading it and sending the
        # batch again appends nothing twice.
        for attempt in range(2):
            pipe = self.connection.pipeline(transaction=False)
            for args in calls:
                pipe.evalsha(self._append.sha, 4, *args)
            try:
                results = pipe.execute()
                break
            except redis.exceptions.NoScriptError:
                if attempt:
                    raise
                self.connection.script_load(self.APPEND)
        return [json.loads(encoded) if encoded else None for encoded in results]

    def end(self, run_id: str, event: dict[str, Any]) -> dict[str, Any] | None:
        """Append ``event``, a settled run's ``run.end``, unless the buffer ends with one already or
        holds nothing (a replay then rebuilds the run, its end included); the event as stored, or
        None. For a run.end the settling process never stored (it died, or Redis refused the batch,
        between its commit and the append): without it a page would show the run running for good.
        Should the settling process store its own after all, that one is refused."""
        args = self._append_args(event, -1, "", "repair")
        encoded = self._append(keys=self._keys(run_id), args=args)
        return json.loads(encoded) if encoded else None

    def lacking_end(self, run_ids: list[str]) -> list[str]:
        """Those of ``run_ids`` whose buffer holds events, the last of which is not a run.end: one
        round trip, so that ``end`` is asked (and its run.end built) only for them."""
        pipe = self.connection.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.zrange(f"chamvi:events:{run_id}", -1, -1)
        # An events key of the old layout (a list) answers with an error: nothing to look at there.
        lasts = pipe.execute(raise_on_error=False)
        return [
            run_id
            for run_id, last in zip(run_ids, lasts, strict=True)
            if isinstance(last, list) and last and json.loads(last[0]).get("type") != RUN_END
        ]

    def window(self, run_id: str, after: int) -> Window:
        top, complete, held = self._window(keys=self._keys(run_id), args=[min(after, MAX_SEQ)])
        return Window(int(top), [json.loads(raw) for raw in held] if complete else None)

    def rebase(self, run_id: str, rebuild: Rebuild, after: int | None) -> list[dict[str, Any]]:
        """Store ``rebuild`` as a region after the run's latest seq and return it. Or return the
        events from the start of a region still held (another client got there first), or those
        after ``after`` when the buffer now holds them all (a seq was allocated meanwhile). With
        ``after`` None (a client that starts over) only a region will do: the held one, or a new
        one. ``after`` never numbers anything, and held events are dropped only by the caps."""
        args = [
            rebuild.ttl,
            max(rebuild.ttl, SEQ_TTL),
            self.max_events,
            rebuild.step,
            rebuild.waiting,
            "1" if rebuild.truncated else "0",
            json.dumps(rebuild.marker),
            -1 if after is None else min(after, MAX_SEQ),
            self.max_bytes,
            *(json.dumps(event) for event in rebuild.events),
        ]
        return [json.loads(raw) for raw in self._rebase(keys=self._keys(run_id), args=args)]

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        """The held events after ``seq``, as they are (tests and tools)."""
        raw = self.connection.zrangebyscore(f"chamvi:events:{run_id}", f"({seq}", "+inf")
        return [json.loads(item) for item in raw]
