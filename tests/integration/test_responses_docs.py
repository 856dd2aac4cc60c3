"""docs/responses-api.md's agent, run: on the Responses API, its reasoning goes back to the model
with the tool call it made."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from chamvi_runs import start_run
from tests.docsamples import block, load_module
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, reasoning, sealed, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


@pytest.fixture
def sample() -> Iterator[types.ModuleType]:
    from chamvi_runs.agents.agent import registry

    try:
        yield load_module("docs_responses_sample", block("responses-agent"))
    finally:
        registry.unregister("order_desk")
        sys.modules.pop("docs_responses_sample", None)


def test_the_order_desk_thinks_looks_the_total_up_and_answers(server, sample):
    assert sample.order_desk.model_api == "responses"
    server.script(
        "o4-mini",
        [
            Reply(
                reasoning("I need the total."),
                tool_call("call_7", "order_total", '{"order_id": "7"}'),
                finish("tool_calls"),
            ),
            Reply(text("Order 7 comes to 45.99."), finish("stop")),
        ],
    )
    run = execute(start_run("order_desk", "How much was order 7?"))
    assert (run.status, run.output) == ("completed", "Order 7 comes to 45.99.")
    first, second = (r["responses"] for r in server.requests_for("o4-mini"))
    assert first["instructions"] == "Answer questions about orders. Look the totals up."
    assert [tool["name"] for tool in first["tools"]] == ["order_total"]
    thought, call, result = second["input"][1:]
    assert (thought["type"], thought["encrypted_content"]) == ("reasoning", sealed("I need the total."))
    assert (call["call_id"], result["output"]) == ("call_7", "4599")
