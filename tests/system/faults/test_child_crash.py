"""A worker SIGKILLed while its run starts child runs (SPEC §13): inside the transaction that
creates the children with the parent's wait step, or right after its commit, before the children
are queued. Either way every delegating call ends with exactly one child, and the parent completes
with their results."""

from __future__ import annotations

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Run, WaitPoint
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.system.faults.harness import recover, violations

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

DELEGATE = Reply(
    tool_call("c1", "billing", '{"task": "refund order 7"}', index=0),
    tool_call("c2", "research", '{"topic": "refunds"}', index=1),
    finish("tool_calls"),
)


def _script(server, delegations: int) -> None:
    server.script("m-triage", [DELEGATE] * delegations + [Reply(text("Both done."), finish("stop"))])
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"))])
    server.script("m-researcher", [Reply(text("30 days."), finish("stop"))])


def _settled(parent: Run, server) -> None:
    parent.refresh_from_db()
    assert (parent.status, parent.output) == ("completed", "Both done.")
    children = list(Run.objects.filter(parent=parent).order_by("parent_position"))
    assert [(c.agent, c.parent_position, c.status) for c in children] == [
        ("billing", 0, "completed"),
        ("researcher", 1, "completed"),
    ]
    assert set(WaitPoint.objects.filter(run=parent).values_list("decision", flat=True)) == {"answered"}
    messages = server.requests_for("m-triage")[-1]["messages"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["Refunded.", "30 days."]
    assert violations() == []


def test_a_worker_killed_before_the_children_commit_leaves_none_and_the_retry_starts_one_each(
    server, audit, pool, queue
):
    # The model call is made again by the recovering worker: it is scripted twice.
    _script(server, delegations=2)
    doomed = pool.spawn(crash_at="before_step_commit")
    parent = start_run("triage", "x")
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash:\n{doomed.output()[-3000:]}"
    # Killed inside the transaction: no child, no wait point, the step not saved.
    assert not Run.objects.filter(parent=parent).exists()
    assert not WaitPoint.objects.filter(run=parent).exists()
    recover([parent.pk], pool)
    _settled(parent, server)
    assert len(server.requests_for("m-triage")) == 3


def test_a_worker_killed_after_the_children_commit_leaves_them_queued_and_they_run_once(
    server, audit, pool, queue
):
    _script(server, delegations=1)
    doomed = pool.spawn(crash_at="after_step_commit")
    parent = start_run("triage", "x")
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash:\n{doomed.output()[-3000:]}"
    # Committed with the wait, never enqueued: chamvi_tick finds their jobs lost.
    children = list(Run.objects.filter(parent=parent).values_list("pk", "status"))
    assert [status for _pk, status in children] == ["queued", "queued"]
    assert Run.objects.get(pk=parent.pk).status == "waiting"
    recover([parent.pk, *(pk for pk, _status in children)], pool)
    _settled(parent, server)
    assert len(server.requests_for("m-triage")) == 2
