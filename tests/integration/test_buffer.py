"""The replay buffer's rules, the same for Redis and for embedded mode's memory: events keyed by
seq, a lifetime that follows the run, a cap, and regions rebuilt from steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chamvi_runs.streaming import buffer
from chamvi_runs.streaming.buffer import MemoryEventLog, Rebuild, RedisEventLog

pytestmark = pytest.mark.timeout(30)

RUN = "run_buffertest"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["redis", "memory"])
def new_log(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Builds the store of the param, with the caps given (``max_events``, ``max_bytes``) or the
    defaults (``BUFFER_EVENTS``, ``BUFFER_BYTES``)."""
    if request.param == "memory":
        yield lambda **caps: MemoryEventLog(clock=Clock(), **caps)
        return
    connection = request.getfixturevalue("redis")
    keys = RedisEventLog._keys(RUN)
    connection.delete(*keys)
    yield lambda **caps: RedisEventLog(connection, **caps)
    connection.delete(*keys)


@pytest.fixture
def log(new_log: Callable[..., Any]) -> Any:
    return new_log()


def expire(log: Any) -> None:
    """Let the buffer's lifetime pass; the seq counter outlives it."""
    if isinstance(log, MemoryEventLog):
        log.clock.now += 10**9
    else:
        log.connection.delete(f"chamvi:events:{RUN}", f"chamvi:region:{RUN}")


def step(index: int, *kinds: str) -> list[dict[str, Any]]:
    kinds = kinds or ("step.start", "step.end")
    return [{"type": kind, "run_id": RUN, "step": index, "attempt": 1} for kind in kinds]


def append(log: Any, events: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    return log.append_many([(RUN, event) for event in events])


def seqs(events: list[dict[str, Any]] | None) -> list[int] | None:
    return None if events is None else [e["seq"] for e in events]


def test_events_are_kept_by_seq_across_an_expiry(log):
    assert seqs(append(log, [{"type": "run.start", "run_id": RUN}, *step(0)])) == [1, 2, 3]
    expire(log)
    assert seqs(append(log, step(1))) == [4, 5]
    window = log.window(RUN, 3)
    assert window.top == 5 and seqs(window.events) == [4, 5]
    assert log.window(RUN, 4).events[0]["type"] == "step.end"
    # Seqs 2 and 3 are gone: whoever asks from before them is told so, not given a partial list.
    assert log.window(RUN, 1) == (5, None)
    assert log.window(RUN, 5) == (5, [])
    assert log.window(RUN, 9) == (5, [])


def test_a_runs_buffer_keeps_the_latest_events_up_to_the_cap(new_log):
    log = new_log(max_events=5)
    append(log, [e for n in range(6) for e in step(n)])
    assert seqs(log.after(RUN, 0)) == [8, 9, 10, 11, 12]
    assert seqs(log.window(RUN, 9).events) == [10, 11, 12]
    assert seqs(log.window(RUN, 7).events) == [8, 9, 10, 11, 12]
    assert log.window(RUN, 6).events is None


def inputs(first: int, count: int, size: int) -> list[dict[str, Any]]:
    """Steering inputs of ``size`` characters each, as the engine announces them."""
    return [
        {"type": "input", "run_id": RUN, "step": 0, "input_id": f"inp_{n}", "payload": "x" * size}
        for n in range(first, first + count)
    ]


def held_bytes(log: Any) -> int:
    """What the buffer counts of its events' JSON (Redis: its counter, checked against the events)."""
    if isinstance(log, MemoryEventLog):
        return log._held[RUN].bytes
    raw = log.connection.zrange(f"chamvi:events:{RUN}", 0, -1)
    counted = int(log.connection.get(f"chamvi:bytes:{RUN}"))
    assert counted == sum(len(event) for event in raw)
    return counted


def test_a_runs_buffer_keeps_at_most_its_bytes_the_oldest_dropped_first(new_log):
    log = new_log(max_bytes=2000)
    # Each input is about 480 bytes of JSON: four fit, the fifth pushes the oldest out.
    assert seqs(append(log, inputs(0, 10, 380))) == list(range(1, 11))
    assert seqs(log.after(RUN, 0)) == [7, 8, 9, 10]
    assert 1900 < held_bytes(log) <= 2000
    # A client behind what the cap dropped is told so (a replay rebuilds the run).
    assert log.window(RUN, 3).events is None
    assert seqs(log.window(RUN, 6).events) == [7, 8, 9, 10]
    # One event larger than the cap is kept, alone: the newest is never dropped.
    assert seqs(append(log, inputs(10, 1, 5000))) == [11]
    assert seqs(log.after(RUN, 0)) == [11]
    assert seqs(append(log, step(1))) == [12, 13]
    assert seqs(log.after(RUN, 0)) == [12, 13]
    assert held_bytes(log) < 500


def test_a_region_is_kept_whole_and_the_events_before_it_go_to_the_byte_cap(new_log):
    log = new_log(max_bytes=2000)
    append(log, inputs(0, 4, 380))
    region = log.rebase(RUN, rebuild(1), None)
    assert seqs(region) == list(range(5, 5 + len(region)))
    held = log.after(RUN, 0)
    assert held[-len(region) :] == region and len(held) < 4 + len(region)
    assert held_bytes(log) <= 2000
    assert log.window(RUN, 0).events == region


def test_a_lost_byte_count_is_counted_again_from_the_events(redis):
    redis.delete(*RedisEventLog._keys(RUN))
    log = RedisEventLog(redis, max_bytes=2000)
    append(log, inputs(0, 3, 380))
    # An older version's buffer has no count; an evicted key neither.
    redis.delete(f"chamvi:bytes:{RUN}")
    append(log, inputs(3, 2, 380))
    assert seqs(log.after(RUN, 0)) == [2, 3, 4, 5]
    assert held_bytes(log) <= 2000
    # A count that is too high (a key restored from elsewhere) is exact again once one event is left.
    redis.set(f"chamvi:bytes:{RUN}", 10**9)
    append(log, step(2, "step.start"))
    assert seqs(log.after(RUN, 0)) == [6]
    assert held_bytes(log) == len(redis.zrange(f"chamvi:events:{RUN}", 0, -1)[0])
    redis.delete(*RedisEventLog._keys(RUN))


def rebuild(step_index: int, waiting: str = "") -> Rebuild:
    events = [{"type": "run.start", "run_id": RUN}]
    for n in range(step_index + 1):
        events += step(n, "step.start", "delta", "step.end")
    if waiting:
        events.append({"type": "run.waiting", "run_id": RUN, "approval_id": waiting})
    marker = {"type": buffer.MARKER, "run_id": RUN, "status": "running", "from_step": 0}
    return Rebuild(marker, events, step_index, f"w:{waiting}" if waiting else "", False, 3600)


def test_a_region_is_numbered_after_the_counter_and_carries_the_step_in_flight(new_log):
    log = new_log(max_events=6)
    # Steps 0 and 1 are stored; step 2 is streaming.
    in_flight = step(2, "step.start", "delta", "delta")
    append(log, [{"type": "run.start", "run_id": RUN}, *step(0), *step(1), *in_flight])
    assert log.window(RUN, 0).events is None
    region = log.rebase(RUN, rebuild(1), 0)
    assert seqs(region) == list(range(9, 9 + len(region)))
    kinds = [(e["type"], e.get("step")) for e in region]
    assert kinds[:2] == [(buffer.MARKER, None), ("run.start", None)]
    # The stored steps rebuilt, then the held events of the step in flight.
    assert kinds[-3:] == [("step.start", 2), ("delta", 2), ("delta", 2)]
    assert kinds[2:-3] == [(k, n) for n in (0, 1) for k in ("step.start", "delta", "step.end")]
    # Every client behind the buffer is served from the region, whoever asked first.
    assert log.rebase(RUN, rebuild(1), 0) == region
    assert log.window(RUN, 0).events == region
    assert log.window(RUN, 8).events == region
    # What the region covers and the executing process records late is dropped; the rest goes on.
    late = append(log, [*step(1, "step.end"), {"type": "run.start", "run_id": RUN}, *step(2, "delta")])
    assert late[:2] == [None, None] and late[2]["seq"] == region[-1]["seq"] + 1
    assert log.window(RUN, region[-1]["seq"]).events == [late[2]]


def test_a_region_of_a_waiting_run_after_an_expiry_holds_its_approval_once(log):
    append(log, [{"type": "run.start", "run_id": RUN}, *step(0), *step(1, "wait")])
    expire(log)
    region = log.rebase(RUN, rebuild(1, waiting="apr_1"), 0)
    assert [e["type"] for e in region][-1] == "run.waiting" and region[0]["seq"] == 5
    # The executing process records its run.waiting after the step: it is not sent a second time.
    assert append(log, [{"type": "run.waiting", "run_id": RUN, "approval_id": "apr_1"}]) == [None]
    resumed = append(log, [{"type": "run.resume", "run_id": RUN}, *step(2, "tool.call")])
    assert seqs(resumed) == [region[-1]["seq"] + 1, region[-1]["seq"] + 2]


def test_a_region_is_not_stored_when_the_buffer_holds_the_events_after_all(log):
    # A client found no seq at all and the run started; meanwhile its first events were recorded.
    append(log, [{"type": "run.start", "run_id": RUN}, *step(0)])
    assert seqs(log.rebase(RUN, rebuild(0), 0)) == [1, 2, 3]
    assert seqs(append(log, step(1))) == [4, 5]


def lose_everything(log: Any) -> None:
    """What a Redis that lost its data, or a restarted embedded-mode process, leaves: no counter."""
    if isinstance(log, MemoryEventLog):
        log._held.clear()
        log._seq.clear()
    else:
        log.connection.delete(*RedisEventLog._keys(RUN))


def counter(log: Any) -> int:
    if isinstance(log, MemoryEventLog):
        return log._seq.get(RUN, 0)
    return int(log.connection.get(f"chamvi:seq:{RUN}") or 0)


def test_a_restart_is_one_region_after_the_counter_whatever_seq_a_client_names(log):
    # A client was sent seqs up to 40; then the counter was lost while step 1 was streaming.
    append(log, [{"type": "run.start", "run_id": RUN}, *step(0), *step(1, "step.start")])
    lose_everything(log)
    since = append(log, step(1, "delta", "delta"))
    assert seqs(since) == [1, 2] and log.window(RUN, 40) == (2, [])
    # A restart asks for a region, whatever the client's seq (None): numbered after the counter.
    region = log.rebase(RUN, rebuild(0), None)
    assert seqs(region) == list(range(3, 3 + len(region)))
    assert [e["type"] for e in region[:2]] == [buffer.MARKER, "run.start"]
    # The stored step, then the step in flight: the held events stay where they are.
    assert [(e["type"], e["step"]) for e in region[-2:]] == [("delta", 1), ("delta", 1)]
    assert log.after(RUN, 0) == [*since, *region]
    assert counter(log) == region[-1]["seq"]
    # Every later restart gets the same region: no new one, the counter stays.
    assert log.rebase(RUN, rebuild(0), None) == region
    assert counter(log) == region[-1]["seq"]
    live = append(log, step(1, "step.end"))
    assert seqs(live) == [region[-1]["seq"] + 1]
    assert log.window(RUN, 2).events == [*region, *live]


@pytest.mark.parametrize("after", [10**12, 10**12 + 1, 10**30])
def test_a_seq_far_ahead_is_only_ahead(log, after):
    append(log, step(0))
    assert log.window(RUN, after) == (2, [])
    assert log.rebase(RUN, rebuild(0), after) == []
    assert counter(log) == 2 and seqs(log.after(RUN, 0)) == [1, 2]


def test_an_active_runs_buffer_lives_through_its_wait_and_ends_after_run_end(log, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "STREAM_BUFFER_SECONDS": 60, "APPROVAL_TTL": 3600}
    expires = (timezone.now() + timedelta(days=3)).isoformat()
    waiting = {"type": "run.waiting", "run_id": RUN, "approval_id": "apr_1", "expires_at": expires}
    append(log, [*step(0), waiting])
    if isinstance(log, MemoryEventLog):
        log.clock.now += 3 * 24 * 3600 - 60
        assert seqs(log.window(RUN, 0).events) == [1, 2, 3]
    else:
        assert 3 * 24 * 3600 < log.connection.ttl(f"chamvi:events:{RUN}") <= 3 * 24 * 3600 + 60
    append(log, [{"type": "run.end", "run_id": RUN, "status": "completed"}])
    if isinstance(log, MemoryEventLog):
        log.clock.now += 61
        assert log.window(RUN, 0) == (4, None)
    else:
        assert 0 < log.connection.ttl(f"chamvi:events:{RUN}") <= 60
        assert log.connection.ttl(f"chamvi:seq:{RUN}") > 30 * 24 * 3600


def test_a_redis_that_lost_the_scripts_gets_them_again_and_records_each_event_once(redis):
    """A Redis restart (or SCRIPT FLUSH) forgets the buffer's scripts; the next batch loads them
    again and records every event once, with no seq skipped."""
    connection = redis
    connection.delete(*RedisEventLog._keys(RUN))
    log = RedisEventLog(connection)
    assert seqs(append(log, step(0))) == [1, 2]
    connection.script_flush()
    assert seqs(append(log, step(1))) == [3, 4]
    assert seqs(log.after(RUN, 0)) == [1, 2, 3, 4]
    connection.delete(*RedisEventLog._keys(RUN))


def test_a_lost_run_end_is_appended_once_with_the_next_seq_and_never_to_nothing(log):
    end = {"type": "run.end", "run_id": RUN, "status": "completed", "output": "x", "inputs": []}
    # Nothing held (expired, or Redis lost it): a replay rebuilds the run, its end included.
    assert log.lacking_end([RUN]) == []
    assert log.end(RUN, end) is None
    assert log.window(RUN, 0) == (0, [])
    # A tool's output that looks like a run.end is not one.
    tool = {"type": "tool.result", "run_id": RUN, "step": 1, "output": {"type": "run.end"}}
    append(log, [*step(0), tool])
    assert log.lacking_end([RUN, "run_other"]) == [RUN]
    stored = log.end(RUN, end)
    assert stored == {**end, "seq": 4}
    # Whoever asks next (another socket, another web process) finds it there; and the settling
    # process, should it store its own after all, is refused: one run.end per run.
    assert log.lacking_end([RUN]) == []
    assert log.end(RUN, end) is None
    assert append(log, [end]) == [None]
    assert log.window(RUN, 2) == (4, [tool | {"seq": 3}, stored])


def test_a_run_end_follows_an_event_that_redis_lua_cannot_decode(log):
    # Python writes a lone surrogate (a filename's undecodable byte) as JSON that cjson refuses.
    odd = {"type": "tool.result", "run_id": RUN, "step": 1, "output": "caf\udcff"}
    end = {"type": "run.end", "run_id": RUN, "status": "completed", "output": "x", "inputs": []}
    append(log, [*step(0), odd])
    assert log.lacking_end([RUN]) == [RUN]
    assert log.end(RUN, end) == {**end, "seq": 4}
