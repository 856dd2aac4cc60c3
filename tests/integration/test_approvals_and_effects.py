"""Approvals (SPEC §6) and effect tools (SPEC §2): wait, decide once, resume; side effects at most once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from chamvi_runs import approve, deny, start_run
from chamvi_runs.agents.agent import registry
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.errors import DecisionRefused
from chamvi_runs.models import Checkpoint, EffectRecord, Step, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, finish, text, tool_call, usage
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def _wait(server, agent="approving"):
    server.script(
        f"m-{agent}",
        [
            Reply(
                text("Refunding."),
                tool_call("c1", "add", '{"a": 1, "b": 1}'),
                tool_call("c2", "refund", REFUND),
                finish("tool_calls"),
                usage(10, 10),
            )
        ],
    )
    run = execute(start_run(agent, "refund o-1"))
    assert run.status == "waiting"
    return run


def test_a_tool_needing_approval_waits_with_a_wait_step_and_released_claim(server):
    run = _wait(server)
    assert run.claim_owner is None and run.model_calls == 1 and run.input_tokens == 10
    steps = list(Step.objects.filter(run=run).values_list("index", "kind", "name"))
    assert steps == [(0, "llm", "m-approving"), (1, "tool", "add"), (2, "wait", "refund")]
    waitpoint = WaitPoint.objects.get(run=run)
    assert (waitpoint.tool_name, waitpoint.input, waitpoint.decision) == (
        "refund",
        {"order_id": "o-1", "amount_cents": 500},
        None,
    )
    assert (
        waitpoint.notified_at is not None and waitpoint.token_hash and waitpoint.expires_at > timezone.now()
    )
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.step_index == 2
    assert [c["id"] for c in open_tool_calls(checkpoint.messages)] == ["c2"]
    waiting = [e for e in events(run) if e["type"] == "run.waiting"]
    assert waiting[0]["approval_id"] == waitpoint.approval_id and waiting[0]["tool_name"] == "refund"
    assert not Refund.objects.exists()


def test_approved_tool_runs_once_and_the_run_completes(server):
    run = _wait(server)
    waitpoint = WaitPoint.objects.get(run=run)
    approve(waitpoint.approval_id, reason="fine")
    run.refresh_from_db()
    assert run.status == "running" and run.claim_owner is None
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.output == "Refunded."
    assert Refund.objects.count() == 1
    assert list(Step.objects.filter(run=run).values_list("kind", flat=True)) == [
        "llm",
        "tool",
        "wait",
        "tool",
        "llm",
    ]
    tool_result = [m for m in server.requests_for("m-approving")[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_result] == ["c1", "c2"]
    announced = [e["tool_call_id"] for e in events(run) if e["type"] == "tool.call"]
    assert announced == ["c1", "c2"], "a call is announced once, when it runs"
    with pytest.raises(DecisionRefused) as refused:
        deny(waitpoint.approval_id)
    assert refused.value.code == "already_decided"


def test_denied_tool_is_not_run_and_the_model_is_told(server):
    run = _wait(server)
    deny(WaitPoint.objects.get(run=run).approval_id, reason="too much")
    server.script("m-approving", [Reply(text("Not refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and not Refund.objects.exists()
    told = [m for m in server.requests_for("m-approving")[1]["messages"] if m["role"] == "tool"][-1]
    assert told["tool_call_id"] == "c2" and "denied" in told["content"] and "too much" in told["content"]


def test_a_second_decision_is_refused_not_applied(server):
    run = _wait(server)
    waitpoint = WaitPoint.objects.get(run=run)
    deny(waitpoint.approval_id)
    with pytest.raises(DecisionRefused):
        approve(waitpoint.approval_id)
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "denied"
    server.script("m-approving", [Reply(text("ok"), finish("stop"))])
    execute(run)


def test_a_duplicate_job_of_a_waiting_run_changes_nothing(server):
    run = _wait(server)
    assert execute(run).status == "waiting"
    assert Step.objects.filter(run=run).count() == 3


def test_expired_approval_is_denied_by_the_janitor_and_the_run_goes_on(server):
    run = _wait(server)
    WaitPoint.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(DecisionRefused) as late:
        approve(WaitPoint.objects.get(run=run).approval_id)
    assert late.value.code == "expired"
    assert tick_once().expired == 1
    assert WaitPoint.objects.get(run=run).decision == "expired"
    server.script("m-approving", [Reply(text("Expired, sorry."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and not Refund.objects.exists()


def test_agents_may_fail_rather_than_deny_on_expiry(server):
    run = _wait(server, agent="expiring_fail")
    WaitPoint.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    tick_once()
    run.refresh_from_db()
    assert run.status == "failed" and run.error_code == "approval_expired"
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


def test_conditional_approval_rule_sees_the_arguments(server):
    server.script(
        "m-conditional",
        [
            Reply(
                tool_call("c1", "refund", '{"order_id": "small", "amount_cents": 10}'), finish("tool_calls")
            ),
            Reply(
                tool_call("c2", "refund", '{"order_id": "big", "amount_cents": 5000}'), finish("tool_calls")
            ),
        ],
    )
    run = execute(start_run("conditional", "x"))
    assert run.status == "waiting"
    assert list(Refund.objects.values_list("order_id", flat=True)) == ["small"]
    assert WaitPoint.objects.get(run=run).input["order_id"] == "big"


def test_notifier_failure_is_retried_by_the_janitor_with_a_fresh_token(server):
    agent = registry.get("approving")
    calls = []

    def flaky(run, waitpoint):
        calls.append(waitpoint.token)
        if len(calls) == 1:
            raise ConnectionError("mail server down")

    agent.notifier = flaky
    try:
        run = _wait(server)
        waitpoint = WaitPoint.objects.get(run=run)
        assert waitpoint.notified_at is None
        # A failed call backs off: the janitor does not re-send at once...
        assert tick_once().notified == 0
        # ...but once the backoff has passed (moved in SQL rather than slept).
        WaitPoint.objects.filter(pk=waitpoint.pk).update(next_notify_at=Now() - timedelta(seconds=1))
        assert tick_once().notified == 1
        waitpoint.refresh_from_db()
        assert waitpoint.notified_at is not None
        assert len(calls) == 2 and calls[0] != calls[1]
        with pytest.raises(DecisionRefused):
            approve(waitpoint.approval_id, token=calls[0])
        approve(waitpoint.approval_id, token=calls[1])
    finally:
        agent.notifier = None
    server.script("m-approving", [Reply(text("done"), finish("stop"))])
    execute(run)


def test_effect_tool_result_is_recorded_and_a_repeat_returns_the_record(server):
    server.script(
        "m-basic",
        [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls")), Reply(text("done"), finish("stop"))],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed"
    record = EffectRecord.objects.get(run=run)
    refund = Refund.objects.get()
    assert record.output == {"refunded": 500, "key": refund.idempotency_key}
    assert refund.idempotency_key == record.key and record.key.startswith(f"{run.pk}:0:0:")
    # A repeated step (as after a crash before its steps were saved) gets the record, not a new refund.
    from chamvi_runs.agents.agent import RunContext
    from chamvi_runs.runtime.effects import run_effect
    from chamvi_runs.store import claim

    type(run).objects.filter(pk=run.pk).update(status="running")
    held = claim(run.pk, "test", 5)
    tool = registry.get("basic").assemble_tools(None)["refund"]
    ctx = RunContext(run=run, agent=registry.get("basic"), idempotency_key=record.key)
    assert run_effect(held, tool, ctx, {"order_id": "o-1", "amount_cents": 500}) == (record.output, "")
    assert Refund.objects.count() == 1


def test_a_raising_effect_tool_rolls_back_its_writes_and_records_the_error(server):
    from tests.testapp.agents import refund

    def broken(ctx, order_id: str, amount_cents: int) -> dict:
        Refund.objects.create(
            order_id=order_id, amount_cents=amount_cents, idempotency_key=ctx.idempotency_key
        )
        raise RuntimeError("payment provider said no")

    original = refund.fn
    object.__setattr__(refund, "fn", broken)  # Tool is frozen; swap its function for this test only.
    try:
        server.script(
            "m-basic",
            [
                Reply(tool_call("c1", "refund", REFUND), finish("tool_calls")),
                Reply(text("failed"), finish("stop")),
            ],
        )
        run = execute(start_run("basic", "x"))
    finally:
        object.__setattr__(refund, "fn", original)
    assert run.status == "completed"
    assert not Refund.objects.exists()
    assert EffectRecord.objects.get(run=run).error == "RuntimeError: payment provider said no"
    assert Step.objects.get(run=run, kind="tool").error == "RuntimeError: payment provider said no"
