"""docs/agents.md's delegation sample, run: the front desk hands a refund and a policy question to
two child runs, and answers from their results."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Run
from tests.docsamples import block, load_module
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

AGENTS = ("refunds", "policy_reader", "front_desk")


@pytest.fixture
def sample() -> Iterator[types.ModuleType]:
    from chamvi_runs.agents.agent import registry

    try:
        yield load_module("docs_delegation_sample", block("agents-delegation"))
    finally:
        for name in AGENTS:
            registry.unregister(name)
        sys.modules.pop("docs_delegation_sample", None)


def test_the_front_desk_delegates_to_two_children_and_answers_from_their_results(server, sample):
    assert sample.front_desk.assemble_tools(None).keys() == {"refunds", "read_policy"}
    read_policy = sample.front_desk.assemble_tools(None)["read_policy"].schema()["function"]
    assert read_policy["description"] == "Quote the refund policy."
    assert read_policy["parameters"]["required"] == ["topic"]
    server.script(
        "gpt-4o-mini",
        [
            # The front desk, then each child as this test executes it, then the front desk again.
            Reply(
                tool_call("c1", "refunds", '{"task": "Refund order 7: it arrived broken."}', index=0),
                tool_call("c2", "read_policy", '{"topic": "broken items"}', index=1),
                finish("tool_calls"),
            ),
            Reply(tool_call("l1", "lookup_order", '{"order_id": "7"}'), finish("tool_calls")),
            Reply(text("Refunded 42.00 EUR for order 7."), finish("stop")),
            Reply(text("Broken items are refunded within 30 days."), finish("stop")),
            Reply(text("Your refund of 42.00 EUR is on its way."), finish("stop")),
        ],
    )
    desk = execute(start_run("front_desk", {"ticket": "My order 7 arrived broken."}))
    assert desk.status == "waiting"
    refund, policy = Run.objects.filter(parent=desk).order_by("parent_position")
    assert (refund.agent, refund.trigger["payload"]) == (
        "refunds",
        {"task": "Refund order 7: it arrived broken."},
    )
    assert (policy.agent, policy.trigger["payload"]) == (
        "policy_reader",
        {"topic": "broken items", "country": "FR"},
    )
    assert execute(refund).status == "completed"
    assert execute(policy).status == "completed"
    desk = execute(Run.objects.get(pk=desk.pk))
    assert (desk.status, desk.output) == ("completed", "Your refund of 42.00 EUR is on its way.")
    last = server.requests_for("gpt-4o-mini")[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "tool"] == [
        "Refunded 42.00 EUR for order 7.",
        "Broken items are refunded within 30 days.",
    ]
    # The policy reader was handed its declared input, defaults filled in.
    first = server.requests_for("gpt-4o-mini")[3]["messages"]
    assert json.loads(first[-1]["content"][0]["text"])["payload"] == {
        "topic": "broken items",
        "country": "FR",
    }
