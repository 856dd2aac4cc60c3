"""Deltas that follow each other within STREAM_COALESCE_SECONDS go out as one event; a delta with
nothing after it goes out alone, without waiting for more. Either way the text joins to the
stored step's text."""

from __future__ import annotations

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Step
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, delay, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _deltas(run) -> list[dict]:
    return [e for e in events(run) if e["type"] == "delta"]


def test_chunks_within_the_window_go_out_as_a_few_deltas(server, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "STREAM_COALESCE_SECONDS": 0.2}
    # 30 chunks 5 ms apart: one at a time, each would be an event of its own.
    chunks = [f"w{n} " for n in range(30)]
    paced = [part for chunk in chunks for part in (delay(0.005), text(chunk))]
    server.script("m-basic", [Reply(*paced, finish("stop"))])
    run = execute(start_run("basic", "x"))
    deltas = _deltas(run)
    assert len(deltas) <= 5, f"30 chunks within the window became {len(deltas)} deltas"
    assert "".join(d["text"] for d in deltas) == "".join(chunks)
    assert Step.objects.get(run=run, kind="llm").output["text"] == "".join(chunks)
    seqs = [e["seq"] for e in events(run)]
    assert seqs == list(range(1, len(seqs) + 1))


def test_chunks_slower_than_the_window_each_go_out_alone(server, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "STREAM_COALESCE_SECONDS": 0.005}
    server.script(
        "m-basic",
        [Reply(text("one "), delay(0.3), text("two "), delay(0.3), text("three"), finish("stop"))],
    )
    run = execute(start_run("basic", "x"))
    assert [d["text"] for d in _deltas(run)] == ["one ", "two ", "three"]


def test_no_window_still_merges_only_what_queued_up(server, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "STREAM_COALESCE_SECONDS": 0}
    server.script("m-basic", [Reply(text("a"), delay(0.3), text("b"), finish("stop"))])
    run = execute(start_run("basic", "x"))
    assert [d["text"] for d in _deltas(run)] == ["a", "b"]


@pytest.mark.django_db(transaction=False)
def test_interleaved_runs_merge_each_run_s_deltas_in_its_own_order():
    """A process executing many runs at once queues their deltas interleaved: each run's deltas
    merge, and no run's events change order."""
    from chamvi_runs.streaming.broadcast import _coalesce

    log = object()

    def delta(run, text, step=0):
        return (log, run, {"type": "delta", "step": step, "attempt": 1, "kind": "text", "text": text}, [])

    def other(run, type_):
        return (log, run, {"type": type_}, [])

    batch = [delta("a", "1"), delta("b", "x"), delta("a", "2"), other("b", "step.end")]
    batch += [delta("a", "3"), delta("b", "y", step=1), other("a", "step.end"), delta("a", "4", step=1)]
    out = [(run, event.get("text", event["type"])) for _, run, event, _ in _coalesce(batch)]
    assert [item for item in out if item[0] == "a"] == [("a", "123"), ("a", "step.end"), ("a", "4")]
    assert [item for item in out if item[0] == "b"] == [("b", "x"), ("b", "step.end"), ("b", "y")]
