"""The offline demo model (``make demo`` without an API key) plays its support conversation again
for each run of a thread: a second run looks its order up and asks for approval again."""

from __future__ import annotations

import json

import pytest

from project.demo.offline import _next_turn

pytestmark = pytest.mark.timeout(10)


def _trigger(text: str) -> dict:
    block = {"source": "api", "trigger": "api", "payload": {"message": text}}
    return {"role": "user", "content": json.dumps(block)}


def _first_run(order: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}
    return [
        {"role": "system", "content": "You are a support agent."},
        _trigger(f"Order {order} arrived broken"),
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        {"role": "assistant", "content": "Refund?", "tool_calls": [{**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"refund_id": "rf_1"}'},
        {"role": "assistant", "content": "Done."},
    ]


def test_a_later_run_of_a_thread_plays_its_own_conversation():
    history = [*_first_run("A-1001"), _trigger("And order A-1002 too, please")]
    assert _next_turn(history).tool_calls == [("lookup_order", {"order_id": "A-1002"})]
    history += [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c3", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c3", "content": "{}"},
    ]
    assert _next_turn(history).tool_calls == [("issue_refund", {"order_id": "A-1002", "amount_cents": 1000})]


def test_a_steering_message_is_not_taken_for_a_new_run():
    history = [*_first_run("A-1001")[:4], {"role": "user", "content": "Please hurry."}]
    assert [name for name, _ in _next_turn(history).tool_calls] == ["issue_refund"]
