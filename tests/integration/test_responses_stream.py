"""One Responses API call through ``ResponsesModel.stream`` and the real ``openai`` client: the turn
it makes of what the provider streams, events the scripted replies do not write included (sent as
``raw`` data lines)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from chamvi_runs.core.types import Aborted, AbortSignal, ModelRequest, ModelTurn
from chamvi_runs.llm_responses import ResponsesModel
from tests.support.scripted_server import Reply, delay, finish, raw, text, usage

pytestmark = pytest.mark.timeout(20)

MODEL = "m-stream"


def stream(abort: AbortSignal | None = None) -> tuple[ModelTurn, list[tuple[str, str]]]:
    deltas: list[tuple[str, str]] = []
    request = ModelRequest(MODEL, [{"role": "user", "content": "hi"}], [])
    turn = ResponsesModel().stream(
        request, lambda kind, text: deltas.append((kind, text)), abort or AbortSignal()
    )
    return turn, deltas


def event(kind: str, **fields: Any) -> Any:
    return raw(json.dumps({"type": kind, "sequence_number": 0, **fields}))


def response(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [], **fields}


def test_a_failed_response_is_the_turns_error_with_its_usage(server):
    failed = response("failed", error={"code": "server_error", "message": "The model crashed."})
    failed["usage"] = {"input_tokens": 9, "output_tokens": 2}
    server.script(MODEL, Reply(text("Par"), event("response.failed", response=failed)))
    turn, _ = stream()
    assert (turn.error, turn.text, turn.finish_reason) == ("The model crashed.", "Par", None)
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (9, 2)


def test_a_call_without_a_call_id_gets_one_of_ours_and_its_whole_arguments(server):
    call = {"type": "function_call", "id": "fc_0", "name": "add", "arguments": "", "status": "in_progress"}
    server.script(
        MODEL,
        Reply(
            event("response.output_item.added", output_index=0, item=call),
            event("response.function_call_arguments.delta", output_index=0, item_id="fc_0", delta='{"a": '),
            event(
                "response.output_item.done",
                output_index=0,
                item={**call, "arguments": '{"a": 1}', "status": "completed"},
            ),
            event("response.completed", response=response("completed")),
        ),
    )
    turn, _ = stream()
    (made,) = turn.tool_calls
    assert made.id.startswith("call_") and (made.name, made.arguments) == ("add", '{"a": 1}')
    assert turn.finish_reason == "tool_calls" and turn.response_items == []


def test_a_refusal_and_a_filtered_response(server):
    server.script(
        MODEL,
        Reply(
            event(
                "response.refusal.delta", output_index=0, item_id="msg_0", content_index=0, delta="I can't."
            ),
            event(
                "response.incomplete",
                response=response("incomplete", incomplete_details={"reason": "content_filter"}),
            ),
        ),
    )
    turn, deltas = stream()
    assert (turn.text, turn.finish_reason, deltas) == ("I can't.", "content_filter", [("text", "I can't.")])


def test_a_lone_surrogate_is_replaced_in_the_deltas_and_the_turn(server):
    server.script(
        MODEL,
        Reply(
            raw('{"type": "response.output_text.delta", "output_index": 0, "delta": "a\\ud800b"}'),
            finish("stop"),
        ),
    )
    turn, deltas = stream()
    assert turn.text == "a\ufffdb" and deltas == [("text", "a\ufffdb")]


def test_reasoning_text_deltas_are_reasoning(server):
    server.script(
        MODEL,
        Reply(
            event(
                "response.reasoning_text.delta", output_index=0, item_id="rs_0", content_index=0, delta="Hmm."
            ),
            text("Yes."),
            finish("stop"),
            usage(3, 4),
        ),
    )
    turn, deltas = stream()
    assert (turn.reasoning, turn.text, deltas) == ("Hmm.", "Yes.", [("reasoning", "Hmm."), ("text", "Yes.")])
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (3, 4)


def test_an_abort_stops_a_blocked_stream_at_once(server):
    server.script(MODEL, Reply(text("Wait"), delay(10), text(" for it"), finish("stop")))
    abort = AbortSignal()
    threading.Timer(0.5, abort.set, args=("cancel",)).start()
    started = time.monotonic()
    with pytest.raises(Aborted):
        stream(abort)
    assert time.monotonic() - started < 2
