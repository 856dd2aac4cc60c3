"""Child runs (SPEC §13) on real ``rqworker`` processes: the children of one model call run at the
same time on different workers, and the parent resumes on whichever worker is free."""

from __future__ import annotations

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Run
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, delay, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_two_children_run_on_two_workers_at_once_and_the_parent_resumes(server, spawn):
    server.script(
        "m-triage",
        [
            Reply(
                tool_call("c1", "billing", '{"task": "refund order 7"}', index=0),
                tool_call("c2", "research", '{"topic": "refunds"}', index=1),
                finish("tool_calls"),
            ),
            Reply(text("Both done."), finish("stop")),
        ],
    )
    # Each child's model thinks for a second: one worker alone would take two.
    server.script("m-billing", [Reply(delay(1.0), text("Refunded."), finish("stop"))])
    server.script("m-researcher", [Reply(delay(1.0), text("30 days."), finish("stop"))])
    workers = [spawn(), spawn()]
    parent = start_run("triage", "x")

    def logs() -> str:
        return "\n".join(w.output()[-3000:] for w in workers)

    wait_for(lambda: Run.objects.get(pk=parent.pk).status == "completed", 40, lambda: "the parent\n" + logs())
    billing, research = Run.objects.filter(parent=parent).order_by("parent_position")
    assert (billing.status, research.status) == ("completed", "completed")
    # They ran at the same time: each started before the other finished.
    assert billing.started_at < research.finished_at and research.started_at < billing.finished_at
    messages = server.requests_for("m-triage")[-1]["messages"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["Refunded.", "30 days."]
    assert Run.objects.get(pk=parent.pk).output == "Both done."
