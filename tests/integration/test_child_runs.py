"""Child runs (SPEC §13) on real PostgreSQL: a delegating call starts one child run, the parent
waits without a worker, and the child's output (or its error) is the call's result once every
child of that model call has settled. Cancel cascades; usage adds up; depth is capped; a lost
wake-up is repaired by chamvi_tick."""

from __future__ import annotations

import json

import pytest

from chamvi_runs import cancel_run, start_run
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.runtime import lifecycle
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import events, execute, logged_in, make_user
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

REFUND = json.dumps({"order_id": "o", "amount_cents": 5})


def _delegates(server, model: str, *calls: tuple[str, str], then: str | None = None) -> None:
    """The model ``model`` makes ``calls`` (tool name, JSON arguments) in one model call, and with
    ``then`` answers that after them."""
    asked = [tool_call(f"c{n}", name, arguments, index=n) for n, (name, arguments) in enumerate(calls)]
    replies = [Reply(*asked, finish("tool_calls"))]
    if then is not None:
        replies.append(Reply(text(then), finish("stop")))
    server.script(model, replies)


def _tool_results(server, model: str) -> list[str]:
    """The tool results the model was sent in its latest request."""
    messages = server.requests_for(model)[-1]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_a_delegation_starts_one_child_and_the_parent_resumes_with_its_output(server):
    alice = make_user("alice")
    server.script(
        "m-triage",
        [
            Reply(
                tool_call("c1", "billing", '{"task": "refund order 7"}'), finish("tool_calls"), usage(10, 5)
            ),
            Reply(text("Done: refunded."), finish("stop"), usage(10, 2)),
        ],
    )
    server.script("m-billing", [Reply(text("Refunded order 7."), finish("stop"), usage(3, 4))])
    parent = execute(start_run("triage", "x", created_by=alice))
    assert parent.status == "waiting" and parent.claim_owner is None

    (child,) = Run.objects.filter(parent=parent)
    assert (child.status, child.agent, child.depth, child.parent_step, child.parent_position) == (
        "queued",
        "billing",
        1,
        0,
        0,
    )
    assert (child.created_by, child.thread, child.scope) == (alice, None, parent.scope)
    assert (child.trigger["source"], child.trigger["payload"]) == ("run", {"task": "refund order 7"})
    wait = WaitPoint.objects.get(run=parent)
    assert (wait.kind, wait.child_id, wait.expires_at, wait.decision) == ("child", child.pk, None, None)
    # Nobody is asked anything: no run.waiting for a person to act on.
    assert not [e for e in events(parent) if e["type"] == "run.waiting"]

    child = execute(child)
    assert child.status == "completed"
    parent.refresh_from_db()
    assert parent.status == "running" and parent.claim_owner is None
    parent = execute(parent)
    assert (parent.status, parent.output) == ("completed", "Done: refunded.")
    assert _tool_results(server, "m-triage") == ["Refunded order 7."]
    # The child's tokens count toward the parent's usage.
    assert (parent.input_tokens, parent.output_tokens) == (10 + 10 + 3, 5 + 2 + 4)
    assert Run.objects.filter(parent=parent).count() == 1


def test_two_delegations_of_one_call_run_as_two_children_and_the_parent_waits_for_both(server):
    server.script(
        "m-triage",
        [
            Reply(
                tool_call("c1", "billing", '{"task": "refund order 7"}', index=0),
                tool_call("c2", "research", '{"topic": "refund policy", "sources": 2}', index=1),
                finish("tool_calls"),
            ),
            Reply(text("Both done."), finish("stop")),
        ],
    )
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"))])
    server.script("m-researcher", [Reply(text("Policy: 30 days."), finish("stop"))])
    parent = execute(start_run("triage", "x"))
    assert parent.status == "waiting"
    billing, research = Run.objects.filter(parent=parent).order_by("parent_position")
    assert (billing.agent, research.agent) == ("billing", "researcher")
    assert research.trigger["payload"] == {"topic": "refund policy", "sources": 2}
    assert WaitPoint.objects.filter(run=parent, kind="child", decision=None).count() == 2

    # Children of one model call run independently; the parent waits for the last of them.
    assert execute(research).status == "completed"
    parent.refresh_from_db()
    assert parent.status == "waiting"
    assert execute(billing).status == "completed"
    parent.refresh_from_db()
    assert parent.status == "running"
    assert execute(parent).status == "completed"
    assert _tool_results(server, "m-triage") == ["Refunded.", "Policy: 30 days."]


def test_the_parents_json_lists_its_children_and_a_childs_names_its_parent(server, client):
    alice = make_user("alice")
    server.script(
        "m-triage",
        [
            Reply(
                tool_call("c1", "billing", '{"task": "a"}', index=0),
                tool_call("c2", "research", '{"topic": "b"}', index=1),
                finish("tool_calls"),
            )
        ],
    )
    server.script("m-researcher", [Reply(text("found"), finish("stop"), usage(2, 3))])
    parent = execute(start_run("triage", "x", created_by=alice))
    billing, research = Run.objects.filter(parent=parent).order_by("parent_position")
    execute(research)
    client.force_login(alice)
    data = client.get(f"/chamvi/api/runs/{parent.pk}/").json()
    assert data["parent"] is None
    assert [(c["id"], c["agent"], c["status"], c["step"], c["position"]) for c in data["children"]] == [
        (billing.pk, "billing", "queued", 0, 0),
        (research.pk, "researcher", "completed", 0, 1),
    ]
    assert data["children"][1]["usage"] == {"input_tokens": 2, "output_tokens": 3}
    # A child belongs to its parent's creator, who views it as their own run.
    child = client.get(f"/chamvi/api/runs/{research.pk}/").json()
    assert child["parent"] == {"run_id": parent.pk, "step": 0, "position": 1}
    assert child["children"] == []
    cancel_run(parent.pk)


def test_a_child_that_fails_is_a_tool_error_the_parent_goes_on_from(server):
    _delegates(
        server, "m-triage", ("judge", '{"task": "judge it"}'), then="The judge failed; I decided myself."
    )
    server.script("m-structured", [Reply(text("not json"), finish("stop"))])
    parent = execute(start_run("triage", "x"))
    (child,) = Run.objects.filter(parent=parent)
    child = execute(child)
    assert (child.status, child.error_code) == ("failed", "invalid_output")
    parent = execute(Run.objects.get(pk=parent.pk))
    assert parent.status == "completed"
    (result,) = _tool_results(server, "m-triage")
    assert result.startswith("Error: the structured run") and "invalid_output" in result
    wait = WaitPoint.objects.get(run=parent)
    assert wait.decision == "failed"


def test_cancelling_the_parent_cancels_its_children(server):
    _delegates(server, "m-triage", ("billing", '{"task": "a"}'), ("research", '{"topic": "b"}'))
    _delegates(server, "m-billing", ("refund", REFUND))
    parent = execute(start_run("triage", "x"))
    billing, research = Run.objects.filter(parent=parent).order_by("parent_position")
    assert execute(billing).status == "waiting"  # for its refund's approval

    assert cancel_run(parent.pk) == "cancelled"
    # One waiting for an approval, one never started: both cancelled.
    assert [Run.objects.get(pk=r.pk).status for r in (billing, research)] == ["cancelled", "cancelled"]
    assert WaitPoint.objects.get(run=billing).decision == "cancelled"
    assert WaitPoint.objects.filter(run=parent, kind="child").exclude(decision="cancelled").count() == 0


def test_delegating_deeper_than_max_child_depth_is_a_tool_error(server, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MAX_CHILD_DEPTH": 1}
    _delegates(server, "m-chain_a", ("chain_b", '{"task": "go"}'), then="ok")
    _delegates(server, "m-chain_b", ("chain_c", '{"task": "deeper"}'), then="I did it myself.")
    top = execute(start_run("chain_a", "x"))
    (middle,) = Run.objects.filter(parent=top)
    middle = execute(middle)
    assert middle.status == "completed" and not Run.objects.filter(parent=middle).exists()
    (result,) = _tool_results(server, "m-chain_b")
    assert "MAX_CHILD_DEPTH" in result
    assert execute(Run.objects.get(pk=top.pk)).status == "completed"


def test_chamvi_tick_wakes_a_parent_whose_wake_up_was_lost(server, monkeypatch, redis):
    _delegates(server, "m-triage", ("billing", '{"task": "a"}'), then="done")
    server.script("m-billing", [Reply(text("ok"), finish("stop"))])
    parent = execute(start_run("triage", "x"))
    (child,) = Run.objects.filter(parent=parent)
    # The child's process dies between its settle's commit and its parent's wake-up.
    monkeypatch.setattr(lifecycle, "wake_parent", lambda child: None)
    assert execute(child).status == "completed"
    parent.refresh_from_db()
    assert parent.status == "waiting"
    monkeypatch.undo()

    report = tick_once()
    assert report.woken == 1
    parent.refresh_from_db()
    assert parent.status == "running"
    assert tick_once().woken == 0  # once
    assert execute(parent).status == "completed"


def test_a_childs_tokens_count_against_its_parents_max_tokens(server):
    # The parent's own calls use 20 tokens of its 50; the child's 40 put it past them.
    server.script(
        "m-triage_limited",
        [Reply(tool_call("c1", "billing", '{"task": "refund"}'), finish("tool_calls"), usage(10, 10))],
    )
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"), usage(30, 10))])
    parent = execute(start_run("triage_limited", "x"))
    (child,) = Run.objects.filter(parent=parent)
    assert execute(child).status == "completed"
    parent = execute(Run.objects.get(pk=parent.pk))
    assert (parent.status, parent.error_code) == ("failed", "budget_exceeded")
    assert (parent.input_tokens, parent.output_tokens) == (40, 20)
    assert len(server.requests_for("m-triage_limited")) == 1, "no model call past the budget"


def test_the_approvals_page_lists_a_childs_approval_with_its_parent_and_decides_it(server):
    approver = make_user("approver", "chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")
    _delegates(server, "m-triage", ("billing", '{"task": "refund"}'))
    _delegates(server, "m-billing", ("refund", REFUND))
    parent = execute(start_run("triage", "x"))
    (child,) = Run.objects.filter(parent=parent)
    assert execute(child).status == "waiting"
    wait = WaitPoint.objects.get(run=child)
    client = logged_in(approver)
    listed = client.get("/chamvi/approvals/").content.decode()
    row = listed[listed.index(f'data-approval-id="{wait.approval_id}"') :].split("</tr>")[0]
    assert f'href="/chamvi/runs/{parent.pk}/"' in row and "parent-link" in row
    response = client.post("/chamvi/approvals/", {"approval_id": wait.approval_id, "action": "approve"})
    assert response.status_code == 302
    assert WaitPoint.objects.get(pk=wait.pk).decision == "approved"
    cancel_run(parent.pk)


def test_nobody_decides_a_wait_for_a_child_run(server):
    from chamvi_runs import approve as approve_call
    from chamvi_runs import deny
    from chamvi_runs.errors import DecisionRefused

    _delegates(server, "m-triage", ("billing", '{"task": "refund"}'))
    parent = execute(start_run("triage", "x"))
    wait = WaitPoint.objects.get(run=parent)
    for decide in (approve_call, deny):
        with pytest.raises(DecisionRefused, match="waits for a child run") as refused:
            decide(wait.approval_id)
        assert refused.value.code == "wrong_kind"
    assert WaitPoint.objects.get(pk=wait.pk).decision is None
    cancel_run(parent.pk)


def test_chamvi_tick_cancels_the_children_of_a_settled_parent(server, monkeypatch, redis):
    _delegates(server, "m-triage", ("billing", '{"task": "a"}'), ("research", '{"topic": "b"}'))
    parent = execute(start_run("triage", "x"))
    # The process that cancels the parent dies before it cancels the children.
    monkeypatch.setattr(lifecycle, "cancel_children", lambda run_id: None)
    assert cancel_run(parent.pk) == "cancelled"
    assert set(Run.objects.filter(parent=parent).values_list("status", flat=True)) == {"queued"}
    monkeypatch.undo()
    assert tick_once().orphans == 2
    assert set(Run.objects.filter(parent=parent).values_list("status", flat=True)) == {"cancelled"}
    assert tick_once().orphans == 0
