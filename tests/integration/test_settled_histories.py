"""Every terminal settle leaves a history a thread can continue: an agent that is gone, an internal
error (which tells viewers no internals)."""

from __future__ import annotations

import pytest

from chamvi_runs import approve, start_run
from chamvi_runs.agents.agent import registry
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.models import Checkpoint, Run, WaitPoint
from tests.support.helpers import execute, make_user
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def test_a_run_whose_agent_is_gone_fails_with_its_history_closed(server):
    alice = make_user("alice")
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x", thread="t-gone", created_by=alice))
    approve(WaitPoint.objects.get(run=run).approval_id)
    # Recorded before agent versions were: a run of a version waits for a worker that has its agent.
    Run.objects.filter(pk=run.pk).update(agent_version="")
    agent = registry.get("approving")
    registry.unregister("approving")
    try:
        run = execute(run)
    finally:
        registry.register(agent)
    assert (run.status, run.error_code) == ("failed", "agent_not_found")
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)
    # The thread goes on: the provider gets a history with every call answered.
    server.script("m-basic", [Reply(text("continued"), finish("stop"))])
    after = execute(start_run("basic", "next", thread="t-gone", created_by=alice))
    assert after.status == "completed"
    assert not open_tool_calls(server.requests_for("m-basic")[-1]["messages"])


def test_an_internal_error_tells_viewers_no_internals_and_closes_the_history(server):
    from chamvi_runs.signals import step_saved

    def broken(*args, **kwargs):
        raise RuntimeError("password=hunter2 at db-7.internal")

    server.script("m-basic", [Reply(tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls"))])
    # A receiver of the site's raises after the tool turn's save.
    step_saved.connect(broken, weak=False)
    try:
        run = execute(start_run("basic", "x"))
    finally:
        step_saved.disconnect(broken)
    assert (run.status, run.error_code) == ("failed", "internal_error")
    assert "hunter2" not in run.error_message and "RuntimeError" in run.error_message
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)
    assert run.model_calls == 1  # the call its save counted was never made
