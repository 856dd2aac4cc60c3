"""Agent versions (SPEC §14) on real PostgreSQL: every run records the version it started with and
every model call the version that made it; they show in the API, the run page and the admin. A call
approved before a deploy changed or removed its tool is checked against the tool as it is now: it
does not run when it no longer fits, and the model is told."""

from __future__ import annotations

import json

import pytest

from chamvi_runs import approve, start_run
from chamvi_runs.agents.agent import registry
from chamvi_runs.agents.tools import effect_tool
from chamvi_runs.models import Run, Step, WaitPoint
from tests.support.helpers import execute, logged_in, make_superuser
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

REFUND = json.dumps({"order_id": "o-1", "amount_cents": 500})


def test_a_run_records_its_agents_version_and_each_model_call_the_version_that_made_it(server, root_client):
    server.script("m-basic", [Reply(text("Hi."), finish("stop"))])
    run = execute(start_run("basic", "x"))
    version = registry.get("basic").version
    assert run.agent_version == version
    assert Step.objects.get(run=run, kind="llm").input["version"] == version
    assert root_client.get(f"/chamvi/api/runs/{run.pk}/").json()["agent_version"] == version
    assert f"version {version}" in root_client.get(f"/chamvi/runs/{run.pk}/").content.decode()
    # The admin filters runs by version: the current ones are offered, any other by its value.
    admin = logged_in(make_superuser("admin"))
    listed = admin.get("/admin/chamvi_runs/run/", {"agent_version": version}).content.decode()
    assert run.pk in listed
    assert run.pk not in admin.get("/admin/chamvi_runs/run/", {"agent_version": "older"}).content.decode()


def _approved_refund(server) -> Run:
    """A run of ``approving`` whose refund was approved, not yet resumed: the deploy comes now."""
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund o-1"))
    approve(WaitPoint.objects.get(run=run).approval_id)
    return run


@effect_tool(name="refund")
def refund_in_currency(ctx, order_id: str, amount_cents: int, currency: str) -> dict:
    """Refund an order, in a currency (a later release's refund)."""
    raise AssertionError("an approval given for other arguments must not run the new refund")


def test_an_approved_call_the_new_tool_rejects_does_not_run_and_the_model_is_told(server, monkeypatch):
    run = _approved_refund(server)
    agent = registry.get("approving")
    # The deploy: refund now needs a currency the approved call does not have.
    monkeypatch.setattr(
        agent, "tools", [t if t.name != "refund" else refund_in_currency for t in agent.tools]
    )
    server.script("m-approving", [Reply(text("The refund did not go through."), finish("stop"))])
    run = execute(Run.objects.get(pk=run.pk))
    assert run.status == "completed"
    assert Refund.objects.count() == 0
    step = Step.objects.get(run=run, kind="tool", name="refund")
    assert "currency" in step.error and step.output is None
    told = [m for m in server.requests_for("m-approving")[-1]["messages"] if m["role"] == "tool"]
    assert "currency" in told[-1]["content"]


def test_an_approved_call_of_a_tool_a_deploy_removed_is_a_clear_tool_error(server, monkeypatch):
    run = _approved_refund(server)
    agent = registry.get("approving")
    monkeypatch.setattr(agent, "tools", [t for t in agent.tools if t.name != "refund"])
    monkeypatch.setattr(agent, "approvals", {})
    server.script("m-approving", [Reply(text("I cannot refund any more."), finish("stop"))])
    run = execute(Run.objects.get(pk=run.pk))
    assert run.status == "completed" and Refund.objects.count() == 0
    step = Step.objects.get(run=run, kind="tool", name="refund")
    assert "no tool named 'refund'" in step.error
