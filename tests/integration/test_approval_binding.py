"""An approval belongs to one call, not to a provider's tool-call id: a reused id gets no later
call through, the approval is bound to the exact arguments asked for, and a repeated call with
other arguments is told what actually ran."""

from __future__ import annotations

import pytest

from chamvi_runs import approve, start_run, store
from chamvi_runs.models import Checkpoint, EffectRecord, Step, WaitPoint
from tests.support.helpers import execute, expire_lease
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'
BIG_REFUND = '{"order_id": "o-2", "amount_cents": 99999}'


def test_a_reused_tool_call_id_does_not_get_a_later_call_through_an_earlier_approval(server):
    server.script(
        "m-approving",
        [
            Reply(tool_call("call_0", "refund", REFUND), finish("tool_calls")),
            # The provider numbers calls per turn: the next turn's call has the same id.
            Reply(tool_call("call_0", "refund", BIG_REFUND), finish("tool_calls")),
        ],
    )
    run = execute(start_run("approving", "x"))
    first = WaitPoint.objects.get(run=run)
    approve(first.approval_id)
    run = execute(run)
    assert run.status == "waiting"
    assert list(Refund.objects.values_list("order_id", flat=True)) == ["o-1"]
    second = WaitPoint.objects.get(run=run, decision__isnull=True)
    assert (second.model_step, second.call_position, second.input["order_id"]) == (3, 0, "o-2")


def test_an_approval_is_bound_to_the_exact_arguments_it_was_asked_for(server):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    approve(waitpoint.approval_id)
    # Tamper with the history's arguments after the decision: the approval no longer covers them.
    checkpoint = Checkpoint.objects.get(run=run)
    messages = checkpoint.messages
    messages[-1]["tool_calls"][0]["function"]["arguments"] = '{"order_id": "o-1", "amount_cents": 500000}'
    Checkpoint.objects.filter(pk=checkpoint.pk).update(messages=messages, whole_step=None, whole_length=None)
    server.script("m-approving", [Reply(text("ok"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and Refund.objects.count() == 0
    step = Step.objects.get(run=run, kind="tool")
    assert step.error == "not run: the approval was given for other arguments"


def test_an_approved_call_with_a_nul_in_its_arguments_runs(server):
    # The approver saw the arguments as stored (the NUL replaced); the approval covers that call.
    nul_refund = '{"order_id": "o\\u0000x", "amount_cents": 5}'
    server.script("m-approving", [Reply(tool_call("c1", "refund", nul_refund), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    assert waitpoint.input == {"order_id": "o\ufffdx", "amount_cents": 5}
    approve(waitpoint.approval_id)
    server.script("m-approving", [Reply(text("ok"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    step = Step.objects.get(run=run, kind="tool")
    assert not step.error.startswith("not run"), step.error
    assert EffectRecord.objects.filter(run=run).count() == 1


# --- effect records and new arguments -----------------------------------------------------------


def test_a_repeated_call_with_other_arguments_is_told_what_actually_ran(server):
    run = start_run("basic", "x")
    dead = store.claim(run.pk, "died-after-the-effect", 30)
    key = f"{run.pk}:0:0:refund"
    # The first execution refunded 500 and died before its step was saved.
    store.record_effect(dead, key, "refund", {"order_id": "o-1", "amount_cents": 500}, {"refunded": 500}, "")
    expire_lease(run.pk)
    server.script(
        "m-basic",
        [
            # The repeated model call asks for another amount at the same place.
            Reply(
                tool_call("c9", "refund", '{"order_id": "o-1", "amount_cents": 700}'), finish("tool_calls")
            ),
            Reply(text("ok"), finish("stop")),
        ],
    )
    run = execute(run)
    assert run.status == "completed"
    assert Refund.objects.count() == 0 and EffectRecord.objects.count() == 1
    step = Step.objects.get(run=run, kind="tool")
    assert step.output is None
    assert "already ran once" in step.error and '"amount_cents": 500' in step.error
    told = server.requests_for("m-basic")[-1]["messages"][-1]
    assert told["role"] == "tool" and "already ran once" in told["content"]
