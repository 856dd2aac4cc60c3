"""A model call is counted before it is made. After a tool turn the next call is counted with the
turn's save (one transaction, not two): these tests hold that the count stays exact when the
execution ends between that save and the call, and what a tool turn costs in statements."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chamvi_runs import cancel_run, start_run
from chamvi_runs.core.types import AbortSignal
from chamvi_runs.models import Run
from chamvi_runs.runtime import engine
from chamvi_runs.signals import step_saved
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _adding(server, turns: int, model: str = "m-basic", *, answer: bool = True) -> None:
    replies = [
        Reply(tool_call(f"c{n}", "add", '{"a": 1, "b": 2}'), finish("tool_calls"), usage(5, 5))
        for n in range(turns)
    ]
    answers = [Reply(text("It is 3."), finish("stop"), usage(5, 1))] if answer else []
    server.script(model, [*replies, *answers])


def _after_first_save(action):
    """Connect ``action(run_id)`` to the first step_saved: it runs after a tool turn's save (which
    counted the next call) and before that call is made."""
    done: list[str] = []

    def receiver(sender, run_id, steps, **kwargs):
        if not done:
            done.append(run_id)
            action(run_id)

    step_saved.connect(receiver, weak=False)
    return receiver


def test_a_drain_after_a_tool_turn_takes_back_the_call_it_counted(server):
    _adding(server, 1)
    run = start_run("basic", "x")
    shutdown = AbortSignal()
    receiver = _after_first_save(lambda _run_id: shutdown.set("drain"))
    try:
        assert engine.execute(run.pk, shutdown=shutdown) == "interrupted"
    finally:
        step_saved.disconnect(receiver)
    run.refresh_from_db()
    assert (run.status, run.model_calls, len(server.requests_for("m-basic"))) == ("interrupted", 1, 1)
    run = execute(run)
    assert (run.status, run.model_calls, len(server.requests_for("m-basic"))) == ("completed", 2, 2)


def test_a_cancel_after_a_tool_turn_leaves_only_the_calls_made_counted(server):
    _adding(server, 1, answer=False)
    run = start_run("basic", "x")
    stop = AbortSignal()

    def cancel(run_id: str) -> None:
        cancel_run(run_id)
        # Stands for the lease keeper's poll, which may come later than this turn: the execution
        # is aborted before its next call, and the requested cancel wins over the drain.
        stop.set("drain")

    receiver = _after_first_save(cancel)
    try:
        assert engine.execute(run.pk, shutdown=stop) == "cancelled"
    finally:
        step_saved.disconnect(receiver)
    run.refresh_from_db()
    assert (run.model_calls, len(server.requests_for("m-basic"))) == (1, 1)
    assert events(run)[-1]["status"] == "cancelled"


def test_a_budget_spent_by_a_tool_turn_counts_no_call_after_it(server):
    _adding(server, 2, "m-limited", answer=False)
    run = execute(start_run("limited", "x"))  # max_steps=2
    assert (run.status, run.error_code) == ("failed", "budget_exceeded")
    assert run.model_calls == len(server.requests_for("m-limited")) == 2


def test_a_tool_turn_writes_in_two_statements_and_one_transaction_on_postgresql(server):
    """Three tool turns and an answer: the claim (2), then per call its count (only the first:
    the others are counted by the turn before), per tool turn the renewal with the call's usage
    and the save (fenced usage and count with the inputs, steps, checkpoint: the first save inserts
    it), and the answer with its settle, whose run row and receipt are
    returned by the settle (nothing is read after it)."""
    _adding(server, 3)
    run = start_run("basic", "x")
    with CaptureQueriesContext(connection) as queries:
        engine.execute(run.pk)
    sent = [q["sql"].strip() for q in queries]
    assert Run.objects.get(pk=run.pk).status == "completed"
    shown = "\n".join(s[:120] for s in sent)
    statements = [s for s in sent if s not in ("BEGIN", "COMMIT")]
    assert len(statements) == 2 + 1 + (1 + 3) * 3 + 4, shown
    assert sum("model_calls = model_calls + 1" in s for s in statements) == 4, shown
    assert not [s for s in statements if s.upper().startswith("SELECT")][1:], shown
    # Commits: the claim; the first call's count; per tool turn, the renewal and the save; the
    # answer with its settle.
    inside, commits = False, 0
    for s in sent:
        if s == "BEGIN":
            inside = True
        elif s == "COMMIT":
            inside, commits = False, commits + 1
        elif not inside:
            commits += 1
    assert commits == 1 + 1 + 2 * 3 + 1, shown
