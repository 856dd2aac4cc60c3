"""Histories stored by parts (SPEC §4, §12): each step stores the messages it added, the checkpoint
the whole history at one step, and the history after any step can be rebuilt exactly: it is what
the model was sent. Against the real PostgreSQL, with the scripted model recording every request."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from chamvi_runs import approve, deny, regenerate, start_run, store
from chamvi_runs.core.messages import ARTIFACT_SCHEME
from chamvi_runs.errors import HistoryUnavailable
from chamvi_runs.models import Artifact, Checkpoint, Run, Step, WaitPoint
from chamvi_runs.runtime import engine
from chamvi_runs.runtime.artifacts import save_artifact
from chamvi_runs.store import histories, references
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

MODEL = "m-basic"
REFUND = '{"order_id": "o-1", "amount_cents": 700}'


# --- helpers --------------------------------------------------------------------------------------


def turns(count: int, final: str = "Done.", *, extra: int = 0) -> list[Reply]:
    """``count`` model calls that each call ``add`` (the second of them twice, and each ``extra``
    times more: a long history), then a final answer."""
    replies = []
    for n in range(count):
        calls = [tool_call(f"c{n}", "add", json.dumps({"a": n, "b": 1}))]
        if n == 1:
            calls.append(tool_call(f"c{n}b", "add", json.dumps({"a": n, "b": 2})))
        calls += [tool_call(f"c{n}x{k}", "add", json.dumps({"a": k, "b": n})) for k in range(extra)]
        replies.append(Reply(text(f"turn {n}"), *calls, finish("tool_calls")))
    replies.append(Reply(text(final), finish("stop")))
    return replies


def sent(server, model: str = MODEL) -> list[list[dict[str, Any]]]:
    """The histories the model was sent, one per call, without the system instructions."""
    requests = server.requests_for(model)
    assert all(r["messages"][0]["role"] == "system" for r in requests)
    return [r["messages"][1:] for r in requests]


def added(run: Run | str) -> list[list[dict[str, Any]]]:
    """The messages each step of ``run`` added, in order: its stored part, or (a step saved with the
    whole history, which holds them) their count of the whole history's messages at its place."""
    saved = checkpoint(run)
    full, at, out = saved.history(), saved.opening_length or 0, []
    for step in steps_of(run):
        part = step.messages if isinstance(step.messages, list) else full[at : at + step.messages]
        assert full[at : at + len(part)] == part, f"step {step.index}'s part is not where it belongs"
        out.append(part)
        at += len(part)
    assert at == len(full)
    return out


def steps_of(run: Run | str) -> list[Step]:
    return list(Step.objects.filter(run_id=getattr(run, "pk", run)).order_by("index"))


def checkpoint(run: Run | str) -> Checkpoint:
    return Checkpoint.objects.get(run_id=getattr(run, "pk", run))


def expected_histories(run: Run, requests: list[list[dict[str, Any]]]) -> dict[int, list[dict[str, Any]]]:
    """Step index -> the history after it, as the model calls saw it: before the n-th model call
    it was exactly the n-th request; a model call adds its answer, a tool step its result. -1: what
    came before the run's trigger message."""
    full = checkpoint(run).history()
    out = {-1: requests[0][:-1]}
    at, calls = 0, iter(requests)
    for step in steps_of(run):
        if step.kind == "llm":
            request = next(calls)
            assert full[: len(request)] == request, (
                f"the history before step {step.index} is not what was sent"
            )
            at = len(request) + 1
        elif step.kind == "tool":
            at += 1
        out[step.index] = full[:at]
    return out


def execute_in_background(run_id: str) -> threading.Thread:
    """``execute`` in a thread of its own, which closes its database connection when done."""

    def target() -> None:
        try:
            engine.execute(run_id)
        finally:
            connection.close()

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    return worker


class Held:
    """A model that answers with ``replies`` in order, and holds call ``held`` until the test lets
    it go: the run stands still between two steps, its earlier steps saved."""

    def __init__(self, replies: list[Reply], held: int) -> None:
        self.replies, self.held, self.calls = replies, held, 0
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self, body: dict[str, Any]) -> Reply:
        n, self.calls = self.calls, self.calls + 1
        if n == self.held:
            self.reached.set()
            self.go.wait(30)
        return self.replies[n]


def as_previous_release(run: Run) -> None:
    """Rewrite the run's stored history as the release before histories by parts left it: the
    whole history in the checkpoint, nothing in its steps, no index or length beside it."""
    Step.objects.filter(run=run).update(messages=None)
    Checkpoint.objects.filter(run=run).update(
        whole_step=None, whole_length=None, length=None, opening_length=None
    )


# --- each step stores what it added -------------------------------------------------------------------


def test_each_step_stores_the_messages_it_added_and_the_checkpoint_the_whole_history(server):
    server.script(MODEL, [Reply(text("Hello."), finish("stop"))])
    before = execute(start_run("basic", "hi", thread="t-parts"))
    server.script(MODEL, turns(3))
    run = execute(start_run("basic", "add things", thread="t-parts"))
    assert run.status == "completed" and run.output == "Done."

    requests = sent(server)[1:]  # the calls of ``run``
    saved = checkpoint(run)
    full = saved.history()
    # The whole history: what the model got on its last call, and its answer.
    assert full == [*requests[-1], {"role": "assistant", "content": "Done."}]
    steps = steps_of(run)
    assert [(s.kind, s.name) for s in steps] == [
        ("llm", MODEL),
        ("tool", "add"),
        ("llm", MODEL),
        ("tool", "add"),
        ("tool", "add"),
        ("llm", MODEL),
        ("tool", "add"),
        ("llm", MODEL),
    ]
    # The opening is the thread's history before the run; then the steps' parts, in order.
    opening = checkpoint(before).history()
    parts = added(run)
    assert full == [*opening, *(m for part in parts for m in part)]
    assert parts[0] == [requests[0][-1], full[len(opening) + 1]]
    assert parts[0][0]["role"] == "user" and parts[0][1]["role"] == "assistant"
    assert parts[3] == [{"role": "tool", "tool_call_id": "c1", "content": "2"}]
    assert parts[4] == [{"role": "tool", "tool_call_id": "c1b", "content": "3"}]
    assert parts[-1] == [{"role": "assistant", "content": "Done."}]
    # A short history is written whole at every save: its steps keep only their counts.
    assert [s.messages for s in steps] == [2, 1, 1, 1, 1, 1, 1, 1]
    assert (saved.step_index, saved.length, saved.opening_length) == (7, len(full), len(opening))


def test_the_history_after_every_step_is_what_the_model_saw(server):
    server.script(MODEL, [Reply(text("Earlier answer."), finish("stop"))])
    before = execute(start_run("basic", "first", thread="t-steps"))
    server.script(MODEL, turns(3))
    run = execute(start_run("basic", "second", thread="t-steps"))

    expected = expected_histories(run, sent(server)[1:])
    assert set(expected) == {-1, *range(8)}
    saved = checkpoint(run)
    for index, history in expected.items():
        assert saved.history(index) == history, f"the history after step {index}"
        assert store.history(run.pk, index) == (history, index)
    # Before its first step, a run of a thread had the thread's history before it.
    assert saved.history(-1) == checkpoint(before).history()
    assert store.history(run.pk) == (saved.history(), 7)
    with pytest.raises(HistoryUnavailable):
        store.history(run.pk, 8)


def test_a_run_without_thread_starts_from_nothing(server):
    server.script(MODEL, turns(1))
    run = execute(start_run("basic", "alone"))
    assert checkpoint(run).history(-1) == []
    assert checkpoint(run).history(0) == sent(server)[0] + [checkpoint(run).history()[1]]


@contextlib.contextmanager
def paused_after_two_model_calls(server) -> Iterator[Run]:
    """A run of three tool turns, held while its third model call is made (steps 0-4 saved); it
    completes when the block ends."""
    held = Held(turns(3), held=2)
    server.respond(MODEL, held)
    run = start_run("basic", "go on")
    worker = execute_in_background(run.pk)
    try:
        assert held.reached.wait(20), "the third model call never came"
        yield run
    finally:
        held.go.set()
        worker.join(30)
    assert Run.objects.get(pk=run.pk).status == "completed"


def test_a_save_after_the_executions_first_adds_parts_and_leaves_the_whole_history_where_it_was(
    server, monkeypatch
):
    # Every history counts as long here: a step writes its parts only.
    monkeypatch.setattr(histories, "WHOLE_UNTIL", 0)
    with paused_after_two_model_calls(server) as run:
        # Two model calls and their tools are saved (steps 0-4); only the first save wrote the
        # whole history.
        mid = checkpoint(run)
        assert mid.step_index == 4
        assert mid.whole_step == 1 and mid.whole_length == len(mid.messages) == 3
        assert mid.length == 6
        assert mid.history() == sent(server)[2]
        # The first save wrote the whole history (its steps keep counts); the second, its parts.
        assert [s.messages for s in steps_of(run)][:2] == [2, 1]
        assert [len(s.messages) for s in steps_of(run)[2:]] == [1, 1, 1]
        assert mid.history(1) == mid.messages and mid.history(2) == sent(server)[2][:4]
    # Settled: the whole history is written at the last step.
    done = checkpoint(run)
    assert (done.whole_step, done.whole_length, done.step_index) == (7, len(done.messages), 7)
    assert done.messages == done.history() == [*sent(server)[-1], {"role": "assistant", "content": "Done."}]


def test_a_short_history_is_written_whole_at_every_save(server):
    """While a history is short, ``Checkpoint.messages`` is the whole of it mid-run too."""
    with paused_after_two_model_calls(server) as run:
        mid = checkpoint(run)
        assert mid.step_index == 4 and mid.whole_step == 4
        assert mid.messages == mid.history() == sent(server)[2]


# --- decisions ----------------------------------------------------------------------------------------


def test_a_denial_joins_the_wait_steps_part_and_the_whole_history(server):
    server.script(
        "m-approving",
        [
            Reply(text("Adding."), tool_call("c0", "add", '{"a": 1, "b": 1}'), finish("tool_calls")),
            Reply(text("Refunding."), tool_call("c1", "refund", REFUND), finish("tool_calls")),
        ],
    )
    run = execute(start_run("approving", "refund o-1"))
    assert run.status == "waiting"
    assert [(s.kind, s.messages) for s in steps_of(run)][-1] == ("wait", 0)
    waiting = checkpoint(run)
    assert waiting.whole_step == 3 and waiting.messages == waiting.history()

    deny(WaitPoint.objects.get(run=run).approval_id, reason="too much")

    denial = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "The call to refund was not run: approval denied. Reason: too much",
    }
    assert steps_of(run)[3].messages == 1 and added(run)[3] == [denial]
    decided = checkpoint(run)
    assert decided.messages[-1] == denial and decided.history() == [*waiting.history(), denial]
    assert (decided.whole_step, decided.whole_length, decided.length) == (
        3,
        len(decided.messages),
        len(decided.messages),
    )
    assert decided.history(3)[-1] == denial and decided.history(2) == waiting.history()

    server.script("m-approving", [Reply(text("Not refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    assert sent(server, "m-approving")[-1] == decided.history()
    expected = expected_histories(run, sent(server, "m-approving"))
    expected[3] = [*expected[2], denial]  # the wait step: nothing before its decision, then the denial
    expected[4] = [*expected[3], {"role": "assistant", "content": "Not refunded."}]
    final = checkpoint(run)
    for index, history in expected.items():
        assert final.history(index) == history, f"the history after step {index}"


def test_an_approved_call_runs_after_the_wait_and_its_result_is_its_steps_part(server):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund o-1"))
    approve(WaitPoint.objects.get(run=run).approval_id)
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    steps = steps_of(run)
    assert [s.kind for s in steps] == ["llm", "wait", "tool", "llm"]
    parts = added(run)
    assert parts[1] == []
    assert parts[2][0]["tool_call_id"] == "c1" and '"refunded": 700' in parts[2][0]["content"]
    assert checkpoint(run).history(2) == sent(server, "m-approving")[-1]


# --- histories the previous release stored whole -----------------------------------------------------


def test_a_history_the_previous_release_stored_whole_is_read_whole_and_resumed_by_parts(server):
    server.script(
        "m-approving",
        [
            Reply(tool_call("c0", "add", '{"a": 2, "b": 2}'), finish("tool_calls")),
            Reply(text("Refunding."), tool_call("c1", "refund", REFUND), finish("tool_calls")),
        ],
    )
    run = execute(start_run("approving", "refund o-1", thread="t-old"))
    assert run.status == "waiting"
    as_previous_release(run)
    old = checkpoint(run)
    whole = list(old.messages)
    assert old.history() == whole and old.history(3) == whole
    for index in (-1, 0, 1, 2):
        with pytest.raises(ValueError):
            old.history(index)
        with pytest.raises(HistoryUnavailable):
            store.history(run.pk, index)

    approve(WaitPoint.objects.get(run=run).approval_id)
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.output == "Refunded."

    requests = sent(server, "m-approving")
    resumed = requests[-1]
    # The model was sent the old whole history, then the approved call's result, once.
    assert resumed[: len(whole)] == whole and len(resumed) == len(whole) + 1
    assert resumed[-1]["role"] == "tool" and resumed[-1]["tool_call_id"] == "c1"
    done = checkpoint(run)
    assert done.history() == [*resumed, {"role": "assistant", "content": "Refunded."}]
    steps = steps_of(run)
    assert [s.messages is None for s in steps] == [True, True, True, True, False, False]
    # Saved with the whole history (an execution's first save, its settle): counts.
    assert steps[4].messages == 1 and steps[5].messages == 1
    assert done.history(5) == done.history()
    for index in (-1, 1, 3, 4):
        with pytest.raises(HistoryUnavailable):
            store.history(run.pk, index)


def test_a_thread_goes_on_from_a_history_the_previous_release_stored_whole(server):
    server.script(MODEL, turns(1, final="Old answer."))
    old = execute(start_run("basic", "before the deploy", thread="t-deploy"))
    as_previous_release(old)
    whole = checkpoint(old).messages
    server.script(MODEL, [Reply(text("New answer."), finish("stop"))])
    new = execute(start_run("basic", "after the deploy", thread="t-deploy"))
    assert new.status == "completed"
    assert sent(server)[-1][:-1] == whole
    assert checkpoint(new).history(-1) == whole
    # A fork at the old run's last step is possible; at an earlier one it is not.
    server.script(MODEL, [Reply(text("Forked."), finish("stop"))])
    fork = execute(start_run("basic", "fork", from_step=(old.pk, checkpoint(old).step_index)))
    assert fork.status == "completed" and sent(server)[-1][:-1] == whole
    with pytest.raises(HistoryUnavailable):
        start_run("basic", "fork", from_step=(old.pk, 0))
    with pytest.raises(HistoryUnavailable):
        regenerate(old.pk)


def test_a_checkpoint_the_previous_release_moved_on_after_this_one_wrote_it_is_read_whole():
    """During a deploy, a process of the previous release takes over a run this release saved: it
    writes the whole history at a later step and leaves this release's fields behind."""
    run = Run.objects.create(agent="basic", status="running", trigger={"payload": "x"})
    now = timezone.now()
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    Step.objects.create(run=run, index=0, kind="llm", name=MODEL, messages=history, started_at=now)
    Checkpoint.objects.create(
        run=run, step_index=0, messages=history, whole_step=0, whole_length=2, length=2, opening_length=0
    )
    later = [*history, {"role": "user", "content": "more"}, {"role": "assistant", "content": "b"}]
    for index in (1, 2):
        Step.objects.create(run=run, index=index, kind="llm", name=MODEL, started_at=now)
    Checkpoint.objects.filter(run=run).update(step_index=2, messages=later)
    assert checkpoint(run).history() == later
    assert store.history(run.pk) == (later, 2)
    with pytest.raises(HistoryUnavailable):
        store.history(run.pk, 1)


# --- prune --------------------------------------------------------------------------------------------


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command("chamvi_prune", *args, stdout=out)
    return out.getvalue()


def age(runs: list[Run], days: float) -> None:
    delta = timedelta(days=days)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        created_at=F("created_at") - delta, finished_at=F("finished_at") - delta
    )


def age_artifacts(artifacts: list[Artifact], days: float) -> None:
    Artifact.objects.filter(pk__in=[a.pk for a in artifacts]).update(created_at=Now() - timedelta(days=days))


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path)
    return tmp_path


def _file_part(artifact: Artifact) -> dict[str, Any]:
    data = {
        "file_data": ARTIFACT_SCHEME + artifact.pk,
        "filename": artifact.filename,
        "media_type": "text/plain",
    }
    return {"type": "file", "file": data}


def test_an_artifact_a_steps_messages_reference_stays_and_an_unreferenced_one_goes(media):
    """A model call's step holds a file part the checkpoint's whole history does not (written at an
    earlier step): the prune keeps its artifact."""
    in_step, orphan = save_artifact(b"kept", "kept.txt"), save_artifact(b"gone", "gone.txt")
    now = timezone.now()
    run = Run.objects.create(agent="basic", status="running", trigger={"payload": "x"}, started_at=now)
    opening = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    added = [{"role": "user", "content": [{"type": "text", "text": "look"}, _file_part(in_step)]}]
    Step.objects.create(run=run, index=0, kind="llm", name=MODEL, messages=opening, started_at=now)
    Step.objects.create(
        run=run,
        index=1,
        kind="llm",
        name=MODEL,
        messages=[*added, {"role": "assistant", "content": "seen"}],
        started_at=now,
    )
    Checkpoint.objects.create(
        run=run, step_index=1, messages=opening, whole_step=0, whole_length=2, length=4, opening_length=0
    )
    assert ARTIFACT_SCHEME + in_step.pk in json.dumps(checkpoint(run).history())
    assert ARTIFACT_SCHEME + in_step.pk not in json.dumps(checkpoint(run).messages)
    assert references.referenced_artifacts(Run.objects.all()) == {in_step.pk}
    assert references.scan_references(Run.objects.all()) == {in_step.pk}
    age_artifacts([in_step, orphan], days=40)

    prune("--older-than", "30d")

    assert set(Artifact.objects.values_list("pk", flat=True)) == {in_step.pk}


def test_a_replaced_run_is_pruned_and_its_replacement_and_thread_go_on(server):
    server.script(MODEL, [Reply(text(f"answer {n}"), finish("stop")) for n in range(5)])
    first = execute(start_run("basic", "q0", thread="t-prune"))
    replaced = execute(start_run("basic", "q1", thread="t-prune"))
    again = execute(regenerate(replaced.pk))
    age([first, replaced, again], days=40)

    prune("--older-than", "30d")

    # The regenerated run carries the thread's history; the runs it came after may go.
    assert set(Run.objects.values_list("pk", flat=True)) == {again.pk}
    regenerated = execute(regenerate(again.pk))
    assert regenerated.status == "completed"
    assert [m["content"] for m in sent(server)[-1] if m["role"] == "assistant"] == ["answer 0"]
    last = execute(start_run("basic", "q2", thread="t-prune"))
    assert last.status == "completed"
    assert [m["content"] for m in sent(server)[-1] if m["role"] == "assistant"] == ["answer 0", "answer 3"]


def test_a_queued_run_that_starts_from_an_old_runs_history_keeps_that_run(server):
    """A fork (or a regenerate, a resend) reads its history from the run it names when it starts:
    the prune must not take that run from under a run still queued."""
    server.script(MODEL, [Reply(text("Old answer."), finish("stop"))])
    old = execute(start_run("basic", "long ago"))
    fork = start_run("basic", "and now?", from_step=(old.pk, 0))
    age([old], days=40)

    prune("--older-than", "30d")

    assert Run.objects.filter(pk=old.pk).exists(), "the fork's history went with its run"
    server.script(MODEL, [Reply(text("Forked."), finish("stop"))])
    assert execute(fork).status == "completed"
