"""The scripted server's ``POST /v1/responses``: what it streams is what the ``openai`` package's types
define (each event validated, strictly, from the bytes on the wire, and parsed by the real client),
and what it records and refuses of a request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from tests.support.scripted_server import (
    Reply,
    ScriptedServer,
    cut,
    error_event,
    finish,
    reasoning,
    sealed,
    text,
    tool_call,
    usage,
)

pytestmark = pytest.mark.timeout(20)

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def client_for(server: ScriptedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=10)


def wire_events(server: ScriptedServer, **request: Any) -> list[dict[str, Any]]:
    """The events of one streamed response as JSON, read from the raw body; each ``event:`` line
    names its data's type."""
    found = []
    with client_for(server).responses.with_streaming_response.create(stream=True, **request) as response:
        for block in response.iter_text():
            for event in block.split("\n\n"):
                if not event.strip():
                    continue
                lines = dict(line.split(": ", 1) for line in event.split("\n"))
                data = json.loads(lines["data"])
                assert lines["event"] == data["type"]
                found.append(data)
    return found


def test_every_event_is_a_valid_responses_stream_event(server):
    server.script(
        "m",
        Reply(
            reasoning("Think"),
            reasoning("ing."),
            text("Hel"),
            text("lo"),
            tool_call("call_1", "add", '{"a": 1, "b": 2}', chunks=3),
            finish("tool_calls"),
            usage(7, 5),
        ),
    )
    found = wire_events(server, model="m", input="hi")
    for data in found:
        EVENTS.validate_python(data, strict=False)
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    done = [e["item"] for e in found if e["type"] == "response.output_item.done"]
    assert [item["type"] for item in done] == ["reasoning", "message", "function_call"]
    assert done[0]["encrypted_content"] == sealed("Thinking.")
    assert done[2]["call_id"] == "call_1" and done[2]["arguments"] == '{"a": 1, "b": 2}'
    last = found[-1]
    assert last["type"] == "response.completed" and last["response"]["usage"]["output_tokens"] == 5
    assert [item["id"] for item in last["response"]["output"]] == ["rs_0", "msg_1", "fc_2"]


@pytest.mark.parametrize(
    ("reason", "kind", "why"),
    [
        ("length", "response.incomplete", "max_output_tokens"),
        ("content_filter", "response.incomplete", "content_filter"),
    ],
)
def test_a_finish_cut_short_is_an_incomplete_response(server, reason, kind, why):
    server.script("m", Reply(text("Hal"), finish(reason)))
    last = wire_events(server, model="m", input="hi")[-1]
    EVENTS.validate_python(last)
    assert (last["type"], last["response"]["incomplete_details"]) == (kind, {"reason": why})


def test_the_real_client_parses_the_stream_and_an_error_event(server):
    server.script("m", [Reply(text("Hi"), finish("stop")), Reply(text("Par"), error_event("overloaded"))])
    client = client_for(server)
    with client.responses.create(model="m", input="hi", stream=True) as stream:
        answered = [event.type for event in stream]
    assert answered[-1] == "response.completed" and "response.output_text.delta" in answered
    with client.responses.create(model="m", input="hi", stream=True) as stream:
        last = list(stream)[-1]
    assert (last.type, last.message) == ("error", "overloaded")


def test_a_cut_drops_the_connection_mid_response(server):
    server.script("m", Reply(text("Hal"), cut()))
    with (
        pytest.raises(openai.APIConnectionError),
        client_for(server).responses.create(model="m", input="hi", stream=True) as stream,
    ):
        list(stream)


def test_a_request_is_recorded_as_the_chat_completions_request_it_stands_for(server):
    server.script("m", Reply(text("ok"), finish("stop")))
    thought = {"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": sealed("")}
    request = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "add"}]},
            thought,
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "3"},
        ],
        "tools": [{"type": "function", "name": "add", "parameters": {}, "strict": False}],
        "text": {"format": {"type": "json_schema", "name": "Out", "schema": {}}},
    }
    wire_events(server, **request)
    (recorded,) = server.requests
    assert recorded["responses"] == {**request, "stream": True}
    assert recorded["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "add"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
            "response_items": [thought, {"type": "function_call", "id": "fc_1"}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    assert recorded["tools"] == [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    assert recorded["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Out", "schema": {}},
    }


@pytest.mark.parametrize(
    ("items", "refusal"),
    [
        (
            [{"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": sealed("")}],
            "without its required following item",
        ),
        (
            [
                {"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": "tampered"},
                {"role": "assistant", "content": "hi", "type": "message", "id": "msg_1"},
            ],
            "could not be verified",
        ),
        ([{"type": "function_call_output", "call_id": "c9", "output": "1"}], "No tool call found"),
    ],
)
def test_what_the_api_refuses_is_refused(server, items, refusal):
    with pytest.raises(openai.BadRequestError, match=refusal):
        client_for(server).responses.create(
            model="m", input=[{"role": "user", "content": "hi"}, *items], stream=True
        )
    assert server.requests == []
