"""Smoke tests for tests.support.scripted_server, driven through the real ``openai`` client."""

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk

from tests.support.scripted_server import (
    Reply,
    ScriptedServer,
    cut,
    delay,
    error_event,
    finish,
    http_error,
    raw,
    reasoning,
    text,
    tool_call,
    usage,
)

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def client_for(server: ScriptedServer, max_retries: int = 0) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="test", max_retries=max_retries, timeout=10)


def stream_chunks(
    client: OpenAI, model: str, collected: list[ChatCompletionChunk] | None = None
) -> list[Any]:
    """Consume a stream; chunks go into ``collected`` too so they survive an exception."""
    chunks = collected if collected is not None else []
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        chunks.append(chunk)
    return chunks


def joined_content(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def finish_reasons(chunks: list[ChatCompletionChunk]) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


def raw_sse(server: ScriptedServer, body: dict[str, Any]) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response, response.read()


@pytest.mark.timeout(20)
def test_text_and_usage_concatenate(server: ScriptedServer) -> None:
    server.script("model-a", [Reply(text("Hel"), text("lo"), finish("stop"), usage(10, 5))])

    chunks = stream_chunks(client_for(server), "model-a")

    assert joined_content(chunks) == "Hello"
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (10, 5)
    assert chunks[-1].usage.total_tokens == 15
    assert all(c.object == "chat.completion.chunk" and c.model == "model-a" for c in chunks)
    assert server.remaining("model-a") == 0
    [request] = server.requests_for("model-a")
    assert request["stream"] is True
    assert request["messages"] == MESSAGES
    assert request["stream_options"] == {"include_usage": True}


@pytest.mark.timeout(20)
def test_wire_format_is_sse_with_done(server: ScriptedServer) -> None:
    server.script("m", [Reply(text("a"), raw("not json"), finish("stop"))])

    response, body = raw_sse(server, {"model": "m", "messages": MESSAGES, "stream": True})

    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    events = body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    first = json.loads(events[0].removeprefix("data: "))
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": "a"}, "finish_reason": None, "logprobs": None}
    ]
    assert events[1] == "data: not json"
    assert json.loads(events[2].removeprefix("data: "))["choices"][0]["finish_reason"] == "stop"


@pytest.mark.timeout(20)
def test_reasoning_content_is_readable(server: ScriptedServer) -> None:
    server.script("m", [Reply(reasoning("think"), reasoning("ing…"), text("answer"), finish("stop"))])

    chunks = stream_chunks(client_for(server), "m")

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    via_getattr = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    via_extra = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert via_getattr == via_extra == "thinking…"
    assert joined_content(chunks) == "answer"


def assemble_tool_calls(chunks: list[ChatCompletionChunk]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return calls


@pytest.mark.timeout(20)
def test_tool_call_deltas_assemble(server: ScriptedServer) -> None:
    server.script(
        "m",
        [
            Reply(
                reasoning("thinking…"),
                tool_call("call_1", "lookup", '{"id": "1"}'),
                tool_call("call_2", "search", '{"q": "abc"}', chunks=3),
                finish("tool_calls"),
                usage(3, 4),
            )
        ],
    )

    chunks = stream_chunks(client_for(server), "m")

    assert assemble_tool_calls(chunks) == {
        0: {"id": "call_1", "name": "lookup", "arguments": '{"id": "1"}'},
        1: {"id": "call_2", "name": "search", "arguments": '{"q": "abc"}'},
    }
    tool_deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    # 1 header + 2 argument pieces, then 1 header + 3 argument pieces.
    assert len(tool_deltas) == 7
    header = tool_deltas[0]
    assert (header.index, header.id, header.type) == (0, "call_1", "function")
    assert header.function is not None and header.function.arguments == ""
    follow_up = tool_deltas[1]
    assert follow_up.id is None and follow_up.function is not None and follow_up.function.name is None
    assert finish_reasons(chunks) == ["tool_calls"]


@pytest.mark.timeout(20)
def test_tool_call_explicit_repeated_index(server: ScriptedServer) -> None:
    server.script(
        "m",
        [
            Reply(
                tool_call("a", "f", "{}", index=0),
                tool_call("b", "g", '{"x": 1}', index=0),
                finish("tool_calls"),
            )
        ],
    )

    chunks = stream_chunks(client_for(server), "m")

    headers = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [] if d.id]
    assert [(d.index, d.id) for d in headers] == [(0, "a"), (0, "b")]


@pytest.mark.timeout(20)
def test_error_event_raises_api_error(server: ScriptedServer) -> None:
    server.script("m", [Reply(text("partial"), error_event("boom"))])
    chunks: list[ChatCompletionChunk] = []

    with pytest.raises(openai.APIError) as excinfo:
        stream_chunks(client_for(server), "m", chunks)

    assert excinfo.value.message == "boom"
    assert joined_content(chunks) == "partial"


@pytest.mark.timeout(20)
def test_cut_raises_connection_error_after_partial_chunks(server: ScriptedServer) -> None:
    server.script("m", [Reply(text("partial"), cut())])
    chunks: list[ChatCompletionChunk] = []

    with pytest.raises(openai.APIConnectionError):
        stream_chunks(client_for(server), "m", chunks)

    assert joined_content(chunks) == "partial"
    assert finish_reasons(chunks) == []


@pytest.mark.timeout(20)
def test_graceful_cut_ends_stream_without_finish_reason(server: ScriptedServer) -> None:
    server.script("m", [Reply(text("partial"), cut(graceful=True))])

    chunks = stream_chunks(client_for(server), "m")

    assert joined_content(chunks) == "partial"
    assert finish_reasons(chunks) == []


@pytest.mark.timeout(20)
def test_http_429_raises_rate_limit_error(server: ScriptedServer) -> None:
    server.script("m", [Reply(http_error(429, "slow down"))])

    with pytest.raises(openai.RateLimitError) as excinfo:
        stream_chunks(client_for(server), "m")

    assert excinfo.value.status_code == 429
    assert excinfo.value.body == {
        "message": "slow down",
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
        "param": None,
    }
    assert excinfo.value.response.headers["retry-after"] == "0"


@pytest.mark.timeout(20)
def test_client_retries_after_429_are_immediate(server: ScriptedServer) -> None:
    server.script(
        "m", [Reply(http_error(429, "slow down")), Reply(http_error(503, "busy")), Reply(text("ok"))]
    )

    started = time.monotonic()
    chunks = stream_chunks(client_for(server, max_retries=2), "m")

    # Without retry-after-ms the client would back off ~0.5 s + ~1 s.
    assert time.monotonic() - started < 0.4
    assert joined_content(chunks) == "ok"
    assert len(server.requests_for("m")) == 3


@pytest.mark.timeout(20)
def test_http_500_raises_internal_server_error(server: ScriptedServer) -> None:
    server.script("m", [Reply(delay(0.05), http_error(500, "kaput"))])

    with pytest.raises(openai.InternalServerError) as excinfo:
        stream_chunks(client_for(server), "m")

    assert excinfo.value.status_code == 500
    assert "kaput" in str(excinfo.value)


@pytest.mark.timeout(20)
def test_exhausted_script_answers_500_without_retries(server: ScriptedServer) -> None:
    server.script("m", [Reply(text("only one"), finish("stop"))])
    client = client_for(server, max_retries=2)
    stream_chunks(client, "m")

    with pytest.raises(openai.InternalServerError) as excinfo:
        stream_chunks(client, "m")
    with pytest.raises(openai.InternalServerError, match="no scripted reply left for model unknown"):
        stream_chunks(client, "unknown")

    assert "no scripted reply left for model m" in str(excinfo.value)
    assert len(server.requests_for("m")) == 2
    assert [r["model"] for r in server.requests] == ["m", "m", "unknown"]


@pytest.mark.timeout(20)
def test_concurrent_streams_both_complete(server: ScriptedServer) -> None:
    server.script("a", [Reply(delay(0.5), text("slow a"), finish("stop"))])
    server.script("b", [Reply(text("slow"), delay(0.5), text(" b"), finish("stop"))])
    client = client_for(server)
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def run(model: str) -> None:
        try:
            results[model] = joined_content(stream_chunks(client, model))
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(model,)) for model in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert errors == []
    assert results == {"a": "slow a", "b": "slow b"}
    assert time.monotonic() - started < 0.95  # served in parallel, not one after the other


@pytest.mark.timeout(20)
def test_non_streamed_completion_from_same_reply(server: ScriptedServer) -> None:
    server.script(
        "m",
        [
            Reply(
                reasoning("hmm"),
                text("Hel"),
                text("lo"),
                tool_call("call_1", "lookup", '{"id": "1"}'),
                finish("tool_calls"),
                usage(7, 2),
            ),
            Reply(text("plain")),
        ],
    )
    client = client_for(server)

    completion = client.chat.completions.create(model="m", messages=MESSAGES)
    plain = client.chat.completions.create(model="m", messages=MESSAGES)

    choice = completion.choices[0]
    assert completion.object == "chat.completion"
    assert choice.message.content == "Hello"
    assert (choice.message.model_extra or {}).get("reasoning_content") == "hmm"
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id == "call_1"
    assert call.type == "function" and (call.function.name, call.function.arguments) == (
        "lookup",
        '{"id": "1"}',
    )
    assert completion.usage is not None and completion.usage.total_tokens == 9
    assert plain.choices[0].message.content == "plain"
    assert plain.choices[0].finish_reason == "stop"


@pytest.mark.timeout(20)
def test_models_endpoint_and_scripting_while_running(server: ScriptedServer) -> None:
    client = client_for(server)
    server.script("m1", [])
    assert [m.id for m in client.models.list()] == ["m1"]

    server.script("m2", Reply(text("late"), finish("stop")))
    server.script("m2", [Reply(text("later"), finish("stop"))])

    assert [m.id for m in client.models.list()] == ["m1", "m2"]
    assert server.remaining("m2") == 2
    assert joined_content(stream_chunks(client, "m2")) == "late"
    assert joined_content(stream_chunks(client, "m2")) == "later"
    assert server.remaining("m2") == 0
    assert server.requests_for("m1") == []


@pytest.mark.timeout(20)
def test_stop_aborts_pending_delays() -> None:
    outcome: list[BaseException | str] = []
    with ScriptedServer() as server:
        server.script("m", [Reply(text("a"), delay(30), text("never"), finish("stop"))])
        client = client_for(server)

        def run() -> None:
            try:
                outcome.append(joined_content(stream_chunks(client, "m")))
            except openai.APIError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        while not server.requests:
            time.sleep(0.01)
        started = time.monotonic()
    assert time.monotonic() - started < 2
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.APIConnectionError)


def test_reply_validation() -> None:
    with pytest.raises(ValueError, match="last"):
        Reply(cut(), text("x"))
    with pytest.raises(ValueError, match="last"):
        Reply(error_event("x"), finish("stop"))
    with pytest.raises(ValueError, match="preceded"):
        Reply(text("x"), http_error(500, "y"))
    Reply(delay(0.1), http_error(500, "y"))
