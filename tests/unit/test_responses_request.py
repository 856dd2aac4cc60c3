"""What the Responses adapter sends for a Chat Completions history (``llm_responses.request_body``):
each kind of message, part, tool and output format as the Responses API names it."""

from __future__ import annotations

import pytest

from chamvi_runs.core.types import RESPONSE_ITEMS, ModelRequest, ModelTurn, ToolCall
from chamvi_runs.llm_responses import request_body

pytestmark = pytest.mark.timeout(10)

TOOL = {
    "type": "function",
    "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}},
}


def body(*messages: dict, tools: list | None = None, response_format: dict | None = None) -> dict:
    return request_body(ModelRequest("m", list(messages), tools or [], response_format))


def test_the_instructions_and_nothing_kept_on_the_provider():
    sent = body({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"})
    assert sent == {
        "model": "m",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }


def test_trigger_parts_become_input_parts():
    trigger = {
        "role": "user",
        "content": [
            {"type": "text", "text": '{"payload": 1}'},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JV==", "filename": "a.pdf"}},
        ],
    }
    assert body(trigger)["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": '{"payload": 1}'},
                {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "auto"},
                {"type": "input_file", "file_data": "data:application/pdf;base64,JV==", "filename": "a.pdf"},
            ],
        }
    ]


def test_a_tool_turn_becomes_a_message_its_function_calls_and_their_outputs():
    turn = ModelTurn(
        text="Adding.", tool_calls=[ToolCall("c1", "add", '{"a": 1}'), ToolCall("c2", "add", "{}")]
    )
    sent = body(
        {"role": "user", "content": "add"},
        turn.assistant_message(),
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: no"},
        {"role": "assistant", "content": "Done."},
    )["input"]
    assert sent[1:] == [
        {"role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "Error: no"},
        {"role": "assistant", "content": "Done."},
    ]


def test_a_turn_with_reasoning_is_sent_back_as_the_provider_sent_it_with_the_historys_calls():
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}
    said = {"type": "message", "id": "msg_2", "role": "assistant", "status": "completed", "content": []}
    turn = ModelTurn(
        text="",
        tool_calls=[ToolCall("call_made_unique_1", "add", "{}")],
        response_items=[thought, said, {"type": "function_call", "id": "fc_3"}],
    )
    stored = turn.assistant_message()
    assert stored[RESPONSE_ITEMS][0] is thought
    assert body(stored)["input"] == [
        thought,
        said,
        {
            "type": "function_call",
            "id": "fc_3",
            "call_id": "call_made_unique_1",
            "name": "add",
            "arguments": "{}",
        },
    ]


def test_a_broken_turn_keeps_no_reasoning_item_the_api_would_refuse_without_its_call():
    turn = ModelTurn(
        text="so far",
        tool_calls=[ToolCall("c1", "add", "{")],
        response_items=[
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_2"},
        ],
    )
    assert turn.assistant_message(with_tool_calls=False) == {"role": "assistant", "content": "so far"}


def test_tools_are_flat_and_not_strict_unless_asked():
    assert body({"role": "user", "content": "x"}, tools=[TOOL])["tools"] == [
        {
            "type": "function",
            "name": "add",
            "description": "Add.",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        }
    ]


def test_a_json_schema_response_format_is_a_text_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "Out", "schema": schema, "strict": True},
    }
    sent = body({"role": "user", "content": "x"}, response_format=response_format)
    assert sent["text"] == {
        "format": {"type": "json_schema", "name": "Out", "schema": schema, "strict": True}
    }
