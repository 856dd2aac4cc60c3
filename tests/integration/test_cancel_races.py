"""A cancel wins over a pause: requested while the model answers, before a drain, or found by a
claim. In-process executions against the real PostgreSQL."""

from __future__ import annotations

import pytest

from chamvi_runs import cancel_run, start_run, store
from chamvi_runs.agents.agent import Approval, registry
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.models import Checkpoint, Run, Step, WaitPoint
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def test_a_cancel_requested_while_the_model_answers_wins_over_the_wait_it_would_open(server):
    agent = registry.get("approving")
    original = agent.approvals["refund"]

    def cancel_then_ask(arguments, ctx) -> bool:
        # The cancel lands after the model's answer and before the wait point is written.
        assert cancel_run(ctx.run.pk) == "running"
        return True

    agent.approvals["refund"] = Approval(when=cancel_then_ask)
    try:
        server.script(
            "m-approving",
            [
                Reply(
                    tool_call("c1", "add", '{"a": 1, "b": 2}'),
                    tool_call("c2", "refund", REFUND),
                    finish("tool_calls"),
                )
            ],
        )
        run = execute(start_run("approving", "x"))
    finally:
        agent.approvals["refund"] = original
    assert run.status == "cancelled"
    assert not WaitPoint.objects.filter(run=run).exists()
    assert Refund.objects.count() == 0
    # The step that completed is kept; the call that would have waited is answered as cancelled.
    steps = list(Step.objects.filter(run=run).values_list("kind", "name"))
    assert steps == [("llm", "m-approving"), ("tool", "add")]
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


def test_a_cancel_requested_before_a_drain_wins_over_interrupted(server):
    from chamvi_runs.core.types import AbortSignal
    from chamvi_runs.runtime.engine import Execution

    run = start_run("basic", "x")
    held = store.claim(run.pk, "draining-worker", 30)
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)  # requested while it was claimed
    shutdown = AbortSignal()
    shutdown.set("drain")
    assert Execution(held, shutdown).run() == "cancelled"
    run.refresh_from_db()
    assert (run.status, run.claim_owner) == ("cancelled", None)


def test_a_claim_of_a_run_with_a_cancel_requested_settles_it_cancelled(server):
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    run = execute(run)
    assert run.status == "cancelled" and run.model_calls == 0
