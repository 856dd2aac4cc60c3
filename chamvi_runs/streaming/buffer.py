"""The replay buffer: a run's events keyed by ``seq``, for clients that reconnect.

``seq`` starts at 1 and grows by 1 per run across every process: it is allocated in Redis when the
queue's Redis is in use, else in this process (embedded mode, one process by definition). Events are
kept by seq (a sorted set scored by seq in Redis), so that "every event after seq N" is a range
query, whatever expired or was trimmed before it:

- Lifetime: the buffer expires ``buffer_ttl()`` after its last event: while the run is active, as
  long as the run can wait (the site's approval TTL, or its open wait point's own expiry) plus
  ``STREAM_BUFFER_SECONDS``; from ``run.end`` on, ``STREAM_BUFFER_SECONDS``. The seq counter lives
  ``SEQ_TTL``: a run that resumes after its buffer expired goes on numbering, never reuses a seq.
- Caps: at most ``BUFFER_EVENTS`` events and ``BUFFER_BYTES`` bytes of their JSON per run; the
  oldest are dropped first, never the newest.
- Regions: when a client asks for events the buffer no longer holds, ``replay`` rebuilds the run
  from its stored steps and, for an active run, stores that rebuild here as a *region* numbered
  after the counter (the rules are in ``replay.py``). Only the run's own counter numbers a region:
  a seq a client names never moves it. A region remembers what it covers (its last
  stored step, its ``run.start`` and open ``run.waiting``): an event it covers that the executing
  process records later (events are recorded a moment after their step is saved) is dropped,
  neither buffered nor sent, so no client gets it twice.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import redis
from django.utils import timezone

from ..conf import conf

# Events kept per run: a model streaming a 4-character delta every 20 ms fills it in 200 s.
BUFFER_EVENTS = 10_000
# Bytes of events' JSON kept per run. A delta event is about 150 bytes, so a model's 10,000 events
# are 1.5 to 2 MB and never reach it; it holds 8 times the steering inputs one model call may take
# (MAX_PENDING_INPUT_BYTES, 1 MiB by default). What it bounds: events that carry what callers and
# tools send (steering inputs of up to MAX_PAYLOAD_BYTES each, tool outputs), kept in Redis for as
# long as a run may wait: by the event cap alone one run could hold 10,000 inputs of 256 KiB (43 MB
# in 3 s was measured).
BUFFER_BYTES = 8 * 1024 * 1024
SEQ_TTL = 90 * 24 * 3600
MARKER = "replay.truncated"
# Above any run's seq: a client's seq is clamped to it before a script sees it (Lua prints numbers
# with 14 digits, so the scripts must never count near 10**14). A larger seq is just ahead.
MAX_SEQ = 10**12


def buffer_ttl(event: dict[str, Any]) -> int:
    """Seconds a run's buffer lives after ``event``: long enough for any wait of an active run,
    ``STREAM_BUFFER_SECONDS`` once it has ended."""
    settled = max(math.ceil(conf.STREAM_BUFFER_SECONDS), 1)
    if event.get("type") == "run.end":
        return settled
    ttl = settled + math.ceil(conf.APPROVAL_TTL.total_seconds())
    expires = event.get("expires_at") if event.get("type") == "run.waiting" else None
    if isinstance(expires, str):
        # An agent's own approval TTL may be longer than the site's.
        try:
            left = (datetime.fromisoformat(expires) - timezone.now()).total_seconds()
        except (TypeError, ValueError):
            return ttl
        ttl = max(ttl, settled + math.ceil(left))
    return ttl


def cover(event: dict[str, Any]) -> tuple[int, str]:
    """What of ``event`` a region may already hold: its step (-1: none) and, for the step-less events
    a rebuild carries, a token (``start`` for run.start, ``w:<approval_id>`` for run.waiting)."""
    step = event.get("step")
    kind = event.get("type")
    token = ""
    if kind == "run.start":
        token = "start"
    elif kind == "run.waiting":
        token = f"w:{event.get('approval_id')}"
    return (step if isinstance(step, int) and not isinstance(step, bool) else -1), token


def waiting_tokens(approval_ids: list[str]) -> str:
    """The cover tokens of a rebuild's open ``run.waiting`` events, as one string (Lua reads it):
    each surrounded by spaces (questions of one model call wait together)."""
    return "".join(f" w:{a}" for a in approval_ids) + " " if approval_ids else ""


def holds_waiting(waiting: str, token: str) -> bool:
    """Whether a region's ``waiting`` tokens hold ``token`` (a region stored by the previous
    release holds one token, unspaced)."""
    return bool(token) and (token == waiting or f" {token} " in waiting)


class Window(NamedTuple):
    """What the buffer holds after a seq: ``top`` is the run's highest seq so far (0: none), and
    ``events`` the held events after the seq, or None when some of them are gone (and no region
    covers them)."""

    top: int
    events: list[dict[str, Any]] | None


@dataclass(frozen=True)
class Rebuild:
    """A run rebuilt from its stored steps, to be stored as a region (``replay.rebuild`` makes it)."""

    marker: dict[str, Any]  # the replay.truncated event that opens a region after lost seqs
    events: list[dict[str, Any]]  # run.start, the stored steps, the open run.waiting (no seq)
    step: int  # the highest stored step index the events cover (-1: none)
    waiting: str  # cover tokens of the run.waiting events they hold (``waiting_tokens``)
    truncated: bool  # earlier steps were left out: the marker opens the region even at seq 0
    ttl: int


def carried(held: list[dict[str, Any]], step: int, waiting: str) -> list[dict[str, Any]]:
    """The held events a region over stored steps up to ``step`` must carry after them: the later
    steps' events (the step in flight), and the step-less ones that came after the covered steps'
    last event (run.resume, a newer run.waiting, run.end). Lua's REBASE applies the same rule."""
    cut = max((e["seq"] for e in held if 0 <= cover(e)[0] <= step), default=0)
    out = []
    for event in held:
        index, token = cover(event)
        if event.get("type") in ("run.start", MARKER):
            continue
        if index >= 0:
            if index > step:
                out.append(event)
        elif event["seq"] > cut and not holds_waiting(waiting, token):
            out.append(event)
    return out


def region(rebuild: Rebuild, held: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The events of a new region after seq ``top``: the marker (when seqs before it were lost or
    steps left out), the rebuilt events, then what ``held`` carries past them."""
    lead = [rebuild.marker] if top > 0 or rebuild.truncated else []
    body = [*lead, *rebuild.events, *carried(held, rebuild.step, rebuild.waiting)]
    return [{**event, "seq": seq} for seq, event in enumerate(body, start=top + 1)]


def _dropped(event: dict[str, Any], covers: tuple[int, int, str] | None) -> bool:
    """Whether a region (first seq, step, waiting token) already holds ``event``."""
    if covers is None:
        return False
    index, token = cover(event)
    return 0 <= index <= covers[1] or token == "start" or holds_waiting(covers[2], token)


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

    def trim(self, droppable: int) -> None:
        """Drop the oldest events, at most ``droppable``, while over either cap."""
        n = 0
        while n < droppable and (len(self.events) - n > BUFFER_EVENTS or self.bytes > BUFFER_BYTES):
            self.bytes -= self.sizes[n]
            n += 1
        del self.events[:n], self.sizes[:n]


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
        if _dropped(event, held.covers):
            return None
        seq = self._seq[run_id] = self._top(run_id, held) + 1
        event = {**event, "seq": seq}
        held.add([event])
        held.trim(len(held.events) - 1)
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
            held.trim(before)  # never into the region
            held.expires = self.clock() + rebuild.ttl
            return events

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        """The held events after ``seq``, as they are (tests and tools)."""
        with self._lock:
            held = self._live(run_id)
            return [e for e in held.events if e["seq"] > seq] if held else []


class RedisEventLog:
    """Per run: ``chamvi:seq:<id>`` (the counter), ``chamvi:events:<id>`` (a sorted set of the
    events' JSON, scored by seq), ``chamvi:region:<id>`` (the latest region: seq, step, waiting) and
    ``chamvi:bytes:<id>`` (the bytes the events hold, for the cap). Each operation is one Lua
    script, so seq order is buffer order and a region is placed atomically among concurrent appends."""

    # The byte count without reading every event: kept beside the events, counted again from them
    # when it is missing (an older version's buffer, an evicted key), and exact whenever one event
    # is left. Trimming never drops the newest event.
    TRIM = """
    local function trim(cap, cap_bytes, bytes, droppable)
      local count = redis.call('ZCARD', KEYS[2])
      if not bytes then
        bytes = 0
        for _, event in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do bytes = bytes + #event end
      end
      while droppable > 0 and count > 1 and (count > cap or bytes > cap_bytes) do
        bytes = bytes - #redis.call('ZPOPMIN', KEYS[2])[1]
        count, droppable = count - 1, droppable - 1
      end
      if count == 1 then bytes = #redis.call('ZRANGE', KEYS[2], 0, 0)[1] end
      return bytes
    end
    """

    # The seq is spliced into the JSON text: cjson would turn empty lists into objects. An events key
    # of the old layout (a list) is replaced. ARGV[7] 'end' (a run.end) or 'repair' (``end``): one
    # run.end per run, never after one; a repair only after held events. pcall: cjson refuses some
    # JSON that Python writes (a lone surrogate), which is not a run.end either. ARGV[8]: the byte cap.
    APPEND = (
        TRIM
        + """
    if ARGV[7] == 'end' or ARGV[7] == 'repair' then
      local held = redis.call('TYPE', KEYS[2]).ok == 'zset'
      if ARGV[7] == 'repair' and not held then return false end
      if held then
        local ok, last = pcall(cjson.decode, redis.call('ZRANGE', KEYS[2], -1, -1)[1])
        if ok and type(last) == 'table' and last.type == 'run.end' then return false end
      end
    end
    local covers = redis.call('HMGET', KEYS[3], 'step', 'waiting')
    if covers[1] then
      local step, token = tonumber(ARGV[5]), ARGV[6]
      if (step >= 0 and step <= tonumber(covers[1])) or token == 'start' or (token ~= ''
          and (token == covers[2] or string.find(covers[2], ' ' .. token .. ' ', 1, true))) then
        return false
      end
    end
    if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2], KEYS[4]) end
    local bytes = redis.call('GET', KEYS[4])
    local seq = redis.call('INCR', KEYS[1])
    local encoded = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
    redis.call('ZADD', KEYS[2], seq, encoded)
    if bytes then bytes = tonumber(bytes) + #encoded end
    bytes = trim(tonumber(ARGV[4]), tonumber(ARGV[8]), bytes, math.huge)
    redis.call('SET', KEYS[4], bytes, 'EX', ARGV[2])
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    redis.call('EXPIRE', KEYS[2], ARGV[2])
    redis.call('EXPIRE', KEYS[3], ARGV[2])
    return encoded
    """
    )

    WINDOW = """
    local after = tonumber(ARGV[1])
    local top = tonumber(redis.call('GET', KEYS[1]) or '0')
    local low = top + 1
    local zset = redis.call('TYPE', KEYS[2]).ok == 'zset'
    if zset then
      low = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
      top = math.max(top, tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]))
    end
    local start = after
    if after < low - 1 and after < top then
      local first = tonumber(redis.call('HGET', KEYS[3], 'seq') or '-1')
      if first < low then return {top, 0, {}} end
      start = first - 1
    end
    if not zset then return {top, 1, {}} end
    return {top, 1, redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. start, '+inf')}
    """

    # ARGV: ttl, seq ttl, cap, step, waiting, truncated, marker, after (-1: none), byte cap, then the
    # rebuilt events. The rule for what is carried after them is ``carried()``'s.
    REBASE = (
        TRIM
        + """
    local top = tonumber(redis.call('GET', KEYS[1]) or '0')
    if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2]) end
    local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local low = top + 1
    if #held > 0 then
      low = tonumber(held[2])
      top = math.max(top, tonumber(held[#held]))
    end
    local after = tonumber(ARGV[8])
    local first = tonumber(redis.call('HGET', KEYS[3], 'seq') or '-1')
    if first >= low then return redis.call('ZRANGEBYSCORE', KEYS[2], first, '+inf') end
    if after >= 0 and top > 0 and not (after < low - 1 and after < top) then
      return redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. after, '+inf')
    end
    local step, waiting = tonumber(ARGV[4]), ARGV[5]
    local decoded, cut, bytes = {}, 0, 0
    for i = 1, #held, 2 do
      local ok, event = pcall(cjson.decode, held[i])
      if not ok or type(event) ~= 'table' then event = {} end
      local seq = tonumber(held[i + 1])
      decoded[#decoded + 1] = {held[i], seq, event}
      bytes = bytes + #held[i]
      if type(event.step) == 'number' and event.step >= 0 and event.step <= step then cut = seq end
    end
    local seq, out = top, {}
    local function push(prefix)
      seq = seq + 1
      local encoded = prefix .. ',"seq":' .. seq .. '}'
      redis.call('ZADD', KEYS[2], seq, encoded)
      bytes = bytes + #encoded
      out[#out + 1] = encoded
    end
    if top > 0 or ARGV[6] == '1' then push(string.sub(ARGV[7], 1, -2)) end
    for i = 10, #ARGV do push(string.sub(ARGV[i], 1, -2)) end
    for _, item in ipairs(decoded) do
      local event, keep = item[3], false
      if event.type == 'run.start' or event.type == 'replay.truncated' then
        keep = false
      elseif type(event.step) == 'number' and event.step >= 0 then
        keep = event.step > step
      else
        local token = ''
        if event.type == 'run.waiting' and type(event.approval_id) == 'string' then
          token = 'w:' .. event.approval_id
        end
        keep = item[2] > cut and not (token ~= '' and (token == waiting
          or string.find(waiting, ' ' .. token .. ' ', 1, true) ~= nil))
      end
      if keep then push((string.gsub(item[1], ',"seq":%d+}$', ''))) end
    end
    redis.call('SET', KEYS[1], seq, 'EX', ARGV[2])
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], 'seq', top + 1, 'step', step, 'waiting', waiting)
    -- Trimmed to the caps, never into the region.
    bytes = trim(tonumber(ARGV[3]), tonumber(ARGV[9]), bytes, #held / 2)
    redis.call('SET', KEYS[4], bytes, 'EX', ARGV[1])
    redis.call('EXPIRE', KEYS[2], ARGV[1])
    redis.call('EXPIRE', KEYS[3], ARGV[1])
    return out
    """
    )

    def __init__(self, connection: Any) -> None:
        self.connection = connection
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

    def append_many(self, items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | None]:
        """Append a batch in one round trip (a pipeline of script calls, run in order). None for an
        event a region already holds."""
        calls = []
        for run_id, event in items:
            ttl = buffer_ttl(event)
            step, token = cover(event)
            once = "end" if event.get("type") == "run.end" else ""
            args = [json.dumps(event), ttl, max(ttl, SEQ_TTL), BUFFER_EVENTS, step, token, once, BUFFER_BYTES]
            calls.append([*self._keys(run_id), *args])
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
        ttl = buffer_ttl(event)
        args = [json.dumps(event), ttl, max(ttl, SEQ_TTL), BUFFER_EVENTS, -1, "", "repair", BUFFER_BYTES]
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
            if isinstance(last, list) and last and json.loads(last[0]).get("type") != "run.end"
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
            BUFFER_EVENTS,
            rebuild.step,
            rebuild.waiting,
            "1" if rebuild.truncated else "0",
            json.dumps(rebuild.marker),
            -1 if after is None else min(after, MAX_SEQ),
            BUFFER_BYTES,
            *(json.dumps(event) for event in rebuild.events),
        ]
        return [json.loads(raw) for raw in self._rebase(keys=self._keys(run_id), args=args)]

    def after(self, run_id: str, seq: int) -> list[dict[str, Any]]:
        """The held events after ``seq``, as they are (tests and tools)."""
        raw = self.connection.zrangebyscore(f"chamvi:events:{run_id}", f"({seq}", "+inf")
        return [json.loads(item) for item in raw]


_memory_log = MemoryEventLog()
_redis_logs: dict[str, RedisEventLog] = {}
_logs_lock = threading.Lock()


def event_log() -> MemoryEventLog | RedisEventLog:
    if conf.EXECUTOR == "thread":
        return _memory_log
    import django_rq

    # One client (and connection pool) per queue and process: redis-py clients are thread-safe.
    with _logs_lock:
        if conf.QUEUE not in _redis_logs:
            _redis_logs[conf.QUEUE] = RedisEventLog(django_rq.get_connection(conf.QUEUE))
        return _redis_logs[conf.QUEUE]
