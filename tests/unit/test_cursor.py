"""The delivery rules both transports share (``streaming/cursor.py``), without any server: what a
stream sends of the events it gets, and what it reads from the buffer first."""

from __future__ import annotations

from typing import Any

from chamvi_runs.streaming import cursor
from chamvi_runs.streaming.cursor import Cursor, Reread, drops


def ev(seq: int, kind: str = "delta", run: str = "r1", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "run_id": run, "seq": seq, **fields}


def test_each_seq_goes_out_once_in_order():
    c = Cursor({"r1": 2}, now=0.0)
    assert c.take([ev(1), ev(2), ev(3), ev(3), ev(4)]) == [ev(3), ev(4)]
    assert c.take([ev(4)]) == []
    assert c.last == {"r1": 4}


def test_a_live_event_after_a_gap_asks_for_what_the_layer_lost():
    c = Cursor({"r1": 0}, now=0.0)
    c.take([ev(1, text="a")])
    reread = c.before_live(ev(4))
    assert reread == Reread("r1", 1, ev(1, text="a"), before=4)
    # Only the gap is sent from what the buffer holds: the live event follows.
    assert c.repaired(reread, [ev(2), ev(3), ev(4)]) == [ev(2), ev(3)]
    assert c.take([ev(4)]) == [ev(4)]
    assert drops(reread, [ev(2), ev(3), ev(4)], [ev(2), ev(3)]) == {"gap": 2}


def test_what_a_gap_repair_could_not_find_is_counted_unrepaired():
    reread = Reread("r1", 1, None, before=5)
    assert drops(reread, [ev(2)], [ev(2)]) == {"gap": 1, "unrepaired": 2}


def test_another_event_at_the_seq_sent_last_asks_for_the_run_again():
    c = Cursor({"r1": 0}, now=0.0)
    c.take([ev(1, "run.start"), ev(2, "run.waiting", approval_id="a")])
    # The run's seqs were lost: the run numbers from 1 again, live, and reaches ours.
    assert c.before_live(ev(1, "run.resume")) is None
    assert c.take([ev(1, "run.resume")]) == []
    reread = c.before_live(ev(2, "tool.call"))
    assert reread == Reread("r1", 2, ev(2, "run.waiting", approval_id="a"))
    # The same event again (a duplicate from joining before the replay) is not a renumbering.
    assert c.before_live(ev(2, "run.waiting", approval_id="a")) is None


def test_a_restart_goes_on_from_its_marker():
    c = Cursor({"r1": 9}, now=0.0)
    restart = [ev(3, "replay.truncated"), ev(4, "run.start"), ev(5, "step.start")]
    assert c.take(restart) == restart
    assert c.last["r1"] == 5
    # A marker above the stream's seq is just the next event.
    assert c.take([ev(6, "replay.truncated"), ev(7, "run.start")]) == [
        ev(6, "replay.truncated"),
        ev(7, "run.start"),
    ]
    assert drops(Reread("r1", 5, None), restart, restart) == {"rebuilt": 1}


def test_the_event_held_at_the_opening_seq_is_what_later_reads_compare_with():
    c = Cursor({"r1": 5}, now=0.0)
    c.know(ev(5, "run.waiting"))
    c.know(ev(4, "step.end"))  # not the stream's seq: ignored
    assert c.quiet_reads() == [Reread("r1", 5, ev(5, "run.waiting"))]
    assert c.before_live(ev(5, "run.resume")) == Reread("r1", 5, ev(5, "run.waiting"))


def test_a_restart_marker_stored_nowhere_is_not_compared():
    c = Cursor({"r1": 4}, now=0.0)
    c.take([ev(0, "replay.truncated")])
    assert c.before_live(ev(0, "run.start")) is None


def test_a_quiet_stream_reads_less_often_and_longest_while_every_run_waits(monkeypatch):
    monkeypatch.setattr(cursor, "QUIET_SECONDS", 1.0)
    monkeypatch.setattr(cursor, "QUIET_MAX_SECONDS", 4.0)
    monkeypatch.setattr(cursor, "QUIET_WAITING_SECONDS", 30.0)
    c = Cursor({"r1": 0, "r2": 0}, now=0.0)
    assert c.quiet_until() == 1.0
    pauses = []
    for _ in range(4):
        c.read_quietly(c.quiet_until(), found=0)
        pauses.append(c.quiet)
    assert pauses == [2.0, 4.0, 4.0, 4.0]
    c.take([ev(1, "run.waiting", run="r1"), ev(1, "run.end", run="r2")])
    assert c.active == {"r1"} and c.waiting == {"r1"}
    for _ in range(4):
        c.read_quietly(c.quiet_until(), found=0)
    assert c.quiet == 30.0
    # Something turned up: read again soon.
    c.read_quietly(100.0, found=2)
    assert c.quiet_until() == 101.0
    # Hearing from a run counts as well.
    c.take([ev(2, "run.resume", run="r1")], now=150.0)
    assert c.quiet_until() == 151.0 and c.waiting == set()


def test_runs_settled_long_ago_are_no_longer_read_and_new_runs_are():
    c = Cursor({"r1": 3}, now=0.0)
    c.unfollow({"r1"})
    assert c.quiet_reads() == []
    c.follow("r2")
    assert c.quiet_reads() == [Reread("r2", 0, None)]


def test_a_quiet_stream_reads_its_children_first_and_its_own_run_last():
    """A parent that ended while the stream was stalled: its run.end goes out after its children's
    events, as it does live."""
    c = Cursor({"z-child": 0, "a-parent": 3}, now=0.0, own="a-parent")
    c.follow("m-grandchild")
    assert [r.run_id for r in c.quiet_reads()] == ["z-child", "m-grandchild", "a-parent"]
