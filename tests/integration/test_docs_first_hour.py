"""Samples of the docs a new user reads in the first hour, run as written: what a scripted model
receives first (docs/testing.md) and the user a tool sees (docs/agents.md)."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest

from chamvi_runs import send_input, start_run
from chamvi_runs.testing import ScriptedModel, ScriptedTurn
from tests.docsamples import block, load_module
from tests.support.helpers import execute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SEEN: list[list[dict[str, Any]]] = []


def _record(messages: list[dict[str, Any]]) -> ScriptedTurn:
    SEEN.append(copy.deepcopy(messages))
    return ScriptedTurn(text="Noted.")


class RecordingScript(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(_record)


def _model(settings: Any, name: str) -> None:
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MODEL": f"{__name__}.{name}"}


def test_the_trigger_message_is_what_a_script_receives_first(settings: Any) -> None:
    _model(settings, "RecordingScript")
    SEEN.clear()
    payload = {"message": "Order A-1001 arrived broken."}
    execute(start_run("basic", payload))
    [first_call] = SEEN
    assert first_call[-1] == json.loads(block("testing-trigger-message"))

    namespace: dict[str, Any] = {}
    exec(compile(block("testing-trigger-payload"), "<testing-trigger-payload>", "exec"), namespace)
    trigger_payload = namespace["trigger_payload"]
    assert trigger_payload(first_call) == payload

    # A run of a thread, steered before its first model call: its own payload, not the thread's
    # first, and not the steering text.
    execute(start_run("basic", {"message": "first"}, thread="t-docs"))
    second = start_run("basic", {"message": "second"}, thread="t-docs")
    send_input(second.pk, "and quickly")
    execute(second)
    last_call = SEEN[-1]
    assert last_call[-1] == {"role": "user", "content": "and quickly"}
    assert trigger_payload(last_call) == {"message": "second"}


def _orders(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if messages[-1]["role"] == "tool":
        return ScriptedTurn(text=f"Result: {messages[-1]['content']}")
    return ScriptedTurn(tool_calls=[("my_orders", {})])


class OrdersScript(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(_orders)


@pytest.fixture
def created_by_sample() -> Any:
    from chamvi_runs.agents.agent import registry

    try:
        yield load_module("docs_created_by_sample", block("agents-created-by"))
    finally:
        registry.unregister("my_orders")
        sys.modules.pop("docs_created_by_sample", None)


def test_a_tool_sees_the_user_who_started_its_run(
    settings: Any, created_by_sample: Any, django_user_model: Any
) -> None:
    _model(settings, "OrdersScript")
    ada = django_user_model.objects.create_user("ada")
    done = execute(start_run("my_orders", {"message": "my orders?"}, created_by=ada))
    assert done.status == "completed"
    assert done.steps.get(kind="tool").output == ["ada-order-1"]

    nobody = execute(start_run("my_orders", {"message": "my orders?"}))
    step = nobody.steps.get(kind="tool")
    assert "started without a user" in step.error and step.output is None
