"""Edit before approving (SPEC §12): an approver changes a call's arguments; the tool runs with them,
the wait point keeps both, and the model is told what a person changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chamvi_runs import approve, start_run
from chamvi_runs.core.records import arguments_hash
from chamvi_runs.errors import DecisionRefused, InvalidAnswer
from chamvi_runs.models import EffectRecord, Run, Step, WaitPoint
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

PROPOSED = {"order_id": "o-1", "amount_cents": 4599}
EDITED = {"order_id": "o-1", "amount_cents": 2000}


def proposal(server, agent: str = "asking") -> tuple[Run, WaitPoint]:
    """A run of ``agent`` waiting for approval of a refund of 45.99."""
    server.script(
        f"m-{agent}",
        [Reply(text("Refunding."), tool_call("c1", "refund", json.dumps(PROPOSED)), finish("tool_calls"))],
    )
    run = execute(start_run(agent, "refund o-1"))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


def finished(server, run: Run, agent: str = "asking") -> Run:
    server.script(f"m-{agent}", [Reply(text("Done."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def told(server, agent: str = "asking") -> str:
    """What the model read as the refund's result."""
    (message,) = [m for m in server.requests_for(f"m-{agent}")[-1]["messages"] if m["role"] == "tool"]
    assert message["tool_call_id"] == "c1"
    return message["content"]


def of_type(run: Run, type_: str) -> list[dict[str, Any]]:
    return [e for e in events(run) if e["type"] == type_]


def test_approved_with_edited_arguments_the_tool_runs_with_them_and_the_model_is_told(server):
    run, waitpoint = proposal(server)
    assert waitpoint.editable is True
    assert of_type(run, "run.waiting")[0]["editable"] is True
    decided = approve(waitpoint.approval_id, reason="partial refund", arguments=EDITED)
    assert decided.decision == "approved"
    waitpoint.refresh_from_db()
    assert waitpoint.input == PROPOSED, "the proposal is kept"
    assert waitpoint.approved_input == EDITED
    assert waitpoint.arguments_hash == arguments_hash(EDITED) != arguments_hash(PROPOSED)
    run = finished(server, run)
    refund = Refund.objects.get()
    assert (refund.order_id, refund.amount_cents) == ("o-1", 2000)
    assert EffectRecord.objects.get(run=run).input == EDITED
    content = told(server)
    assert "changed the arguments" in content
    assert "2000" in content and "4599" in content, content
    assert '"refunded": 2000' in content, "the result follows the note"
    (announced,) = of_type(run, "tool.call")
    assert announced["tool_call_id"] == "c1" and announced["input"] == EDITED
    (result,) = of_type(run, "tool.result")
    assert result["output"]["refunded"] == 2000
    tool_step = Step.objects.get(run=run, kind="tool")
    assert tool_step.input == EDITED
    resumed = of_type(run, "run.resume")[0]["decision"]
    assert (resumed["kind"], resumed["input"], resumed["approved_input"]) == ("approval", PROPOSED, EDITED)
    (end,) = of_type(run, "run.end")
    assert [(d["input"], d["approved_input"], d["answer"]) for d in end["decisions"]] == [
        (PROPOSED, EDITED, None)
    ]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"order_id": "o-1", "amount_cents": "lots"}, "amount_cents"),
        ({"order_id": "o-1"}, "amount_cents"),
        ({"amount_cents": 100}, "order_id"),
    ],
    ids=["wrong-type", "missing-amount", "missing-order"],
)
def test_edited_arguments_the_tool_refuses_name_the_field_and_record_nothing(server, arguments, field):
    run, waitpoint = proposal(server)
    with pytest.raises(InvalidAnswer) as refused:
        approve(waitpoint.approval_id, arguments=arguments)
    assert refused.value.code == "invalid_arguments"
    assert field in str(refused.value)
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.approved_input) == (None, None)
    assert waitpoint.arguments_hash == arguments_hash(PROPOSED)
    assert Run.objects.get(pk=run.pk).status == "waiting"
    # Still open: approved as proposed, the proposal runs.
    approve(waitpoint.approval_id)
    finished(server, run)
    assert Refund.objects.get().amount_cents == 4599


def test_arguments_that_are_not_an_object_are_refused(server):
    _, waitpoint = proposal(server)
    with pytest.raises(InvalidAnswer) as refused:
        approve(waitpoint.approval_id, arguments=[1, 2])  # type: ignore[arg-type]
    assert refused.value.code == "invalid_arguments"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


def test_a_tool_whose_approval_is_not_editable_refuses_edits(server):
    run, waitpoint = proposal(server, agent="editing_locked")
    assert waitpoint.editable is False
    assert of_type(run, "run.waiting")[0]["editable"] is False
    with pytest.raises(InvalidAnswer) as refused:
        approve(waitpoint.approval_id, arguments=EDITED)
    assert refused.value.code == "not_editable"
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.approved_input) == (None, None)
    # A plain approval still goes through, with the proposal.
    approve(waitpoint.approval_id)
    finished(server, run, agent="editing_locked")
    assert Refund.objects.get().amount_cents == 4599
    assert "changed" not in told(server, agent="editing_locked")


def test_approving_the_proposal_unchanged_is_a_plain_approval(server):
    run, waitpoint = proposal(server)
    # The same arguments, in another order: nothing changed.
    approve(waitpoint.approval_id, arguments={"amount_cents": 4599, "order_id": "o-1"})
    waitpoint.refresh_from_db()
    assert waitpoint.decision == "approved" and waitpoint.approved_input is None
    assert waitpoint.arguments_hash == arguments_hash(PROPOSED)
    finished(server, run)
    assert Refund.objects.get().amount_cents == 4599
    content = told(server)
    assert "changed" not in content and json.loads(content)["refunded"] == 4599


def test_an_edit_is_refused_once_the_approval_was_decided(server):
    run, waitpoint = proposal(server)
    approve(waitpoint.approval_id, arguments=EDITED)
    with pytest.raises(DecisionRefused) as again:
        approve(waitpoint.approval_id, arguments={"order_id": "o-1", "amount_cents": 1})
    assert again.value.code == "already_decided"
    assert WaitPoint.objects.get(pk=waitpoint.pk).approved_input == EDITED
    finished(server, run)
    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [2000]


def test_a_question_cannot_be_approved_with_arguments(server):
    server.script(
        "m-asking", [Reply(tool_call("c1", "ask_user", '{"question": "Which?"}'), finish("tool_calls"))]
    )
    run = execute(start_run("asking", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    with pytest.raises(DecisionRefused) as refused:
        approve(waitpoint.approval_id, arguments={"question": "Other?"})
    assert refused.value.code == "wrong_kind"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
