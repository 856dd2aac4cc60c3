"""Agents on the Responses API (``model_api="responses"``, SPEC §15): the reasoning items of a turn go
back to the model with it, in the same execution, after an approval and after a dead worker's run is
taken over; structured output, errors, cut streams, retries and reused call ids, through the real
``openai`` client and the scripted server's ``/v1/responses``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

from chamvi_runs import Agent, approve, start_run
from chamvi_runs.agents.agent import registry
from chamvi_runs.core.types import RESPONSE_ITEMS, AbortSignal, ModelRequest
from chamvi_runs.llm_openai import OpenAIModel
from chamvi_runs.models import Checkpoint, Step, WaitPoint
from chamvi_runs.runtime import engine
from tests.support.helpers import events, execute, expire_lease
from tests.support.scripted_server import (
    Reply,
    cut,
    delay,
    error_event,
    finish,
    http_error,
    reasoning,
    sealed,
    text,
    tool_call,
    usage,
)
from tests.testapp.agents import TOOLS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


class Verdict(pydantic.BaseModel):
    label: str
    score: float


@pytest.fixture(autouse=True)
def agents() -> Iterator[None]:
    """Agents of this module only, each with a model of its own (its script on the server)."""
    made = [
        Agent(name="thinker", model="m-thinker", instructions="Think.", tools=TOOLS, model_api="responses"),
        Agent(
            name="careful",
            model="m-careful",
            instructions="Ask first.",
            tools=TOOLS,
            approvals={"refund": True},
            model_api="responses",
        ),
        Agent(name="judge", model="m-judge", instructions="Judge.", output=Verdict, model_api="responses"),
        Agent(name="plain", model="m-plain", model_api="responses"),
    ]
    yield
    for agent in made:
        registry.unregister(agent.name)


def sent(server, model: str, call: int) -> list[dict[str, Any]]:
    """The Responses ``input`` of the model's ``call``-th request, as sent."""
    return server.requests_for(model)[call]["responses"]["input"]


def kinds(items: list[dict[str, Any]]) -> list[str]:
    return [item.get("type") or item["role"] for item in items]


def thinking_then(call: str, name: str, arguments: str) -> Reply:
    return Reply(
        reasoning("First "),
        reasoning("the sum."),
        text("Adding."),
        tool_call(call, name, arguments),
        finish("tool_calls"),
        usage(20, 10),
    )


def test_reasoning_items_go_back_with_the_turn_in_the_same_execution(server):
    server.script(
        "m-thinker",
        [
            thinking_then("call_1", "add", '{"a": 2, "b": 3}'),
            Reply(text("It is 5."), finish("stop"), usage(30, 3)),
        ],
    )
    run = execute(start_run("thinker", "add 2 and 3"))
    assert (run.status, run.output, run.input_tokens, run.output_tokens) == ("completed", "It is 5.", 50, 13)
    first = server.requests_for("m-thinker")[0]["responses"]
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert first["instructions"] == "Think."
    assert {"type": "function", "name": "add"}.items() <= first["tools"][0].items()
    second = sent(server, "m-thinker", 1)
    assert kinds(second) == ["user", "reasoning", "message", "function_call", "function_call_output"]
    thought, said, call, result = second[1:]
    assert (thought["id"], thought["encrypted_content"]) == ("rs_0", sealed("First the sum."))
    assert thought["summary"] == [{"type": "summary_text", "text": "First the sum."}]
    assert (said["id"], said["content"][0]["text"]) == ("msg_1", "Adding.")
    assert (call["id"], call["call_id"], call["arguments"]) == ("fc_2", "call_1", '{"a": 2, "b": 3}')
    assert (result["call_id"], result["output"]) == ("call_1", "5")
    llm = Step.objects.get(run=run, index=0)
    assert (llm.output["reasoning"], llm.output["text"]) == ("First the sum.", "Adding.")
    streamed = [e["text"] for e in events(run) if e["type"] == "delta" and e["kind"] == "reasoning"]
    assert "".join(streamed) == "First the sum."


def test_a_final_answer_without_reasoning_is_stored_as_a_chat_completions_answer(server):
    server.script("m-thinker", [Reply(text("Hel"), text("lo"), finish("stop"), usage(4, 2))])
    run = execute(start_run("thinker", "hi"))
    assert run.output == "Hello"
    assert Checkpoint.objects.get(run=run).messages[-1] == {"role": "assistant", "content": "Hello"}


def test_reasoning_items_go_back_after_an_approval_in_the_next_execution(server):
    server.script(
        "m-careful",
        [Reply(reasoning("A refund needs a yes."), tool_call("c1", "refund", REFUND), finish("tool_calls"))],
    )
    run = execute(start_run("careful", "refund o-1"))
    assert run.status == "waiting"
    kept = Checkpoint.objects.get(run=run).messages[-1][RESPONSE_ITEMS]
    assert [item["type"] for item in kept] == ["reasoning", "function_call"]
    approve(WaitPoint.objects.get(run=run).approval_id)
    server.script("m-careful", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert (run.status, run.output) == ("completed", "Refunded.")
    second = sent(server, "m-careful", 1)
    assert kinds(second) == ["user", "reasoning", "function_call", "function_call_output"]
    assert second[1]["encrypted_content"] == sealed("A refund needs a yes.")
    assert second[2]["id"] == "fc_1" and second[3]["call_id"] == "c1"


def test_reasoning_items_go_back_when_a_dead_workers_run_is_taken_over(server):
    server.script(
        "m-thinker",
        [
            thinking_then("call_1", "add", '{"a": 1, "b": 1}'),
            # The first execution's next call hangs: its worker is as good as dead.
            Reply(delay(20), text("never")),
            Reply(text("It is 2."), finish("stop")),
        ],
    )
    run = start_run("thinker", "add")
    first = threading.Thread(target=engine.execute, args=(run.pk,), daemon=True)
    first.start()
    try:
        while len(server.requests_for("m-thinker")) < 2:
            assert first.is_alive(), "the first execution ended before its second call"
            threading.Event().wait(0.05)
        # Until the lease is taken over: the first execution's heartbeat may renew it in between.
        while run.attempt < 2:
            expire_lease(run.pk)
            run = execute(run)
    finally:
        first.join(10)
    assert (run.status, run.output, run.attempt) == ("completed", "It is 2.", 2)
    taken_over = sent(server, "m-thinker", 2)
    assert taken_over == sent(server, "m-thinker", 1), "the checkpoint's history, sent again as it was"
    assert kinds(taken_over) == ["user", "reasoning", "message", "function_call", "function_call_output"]
    assert taken_over[1]["encrypted_content"] == sealed("First the sum.")


def test_structured_output_is_asked_for_as_a_text_format_and_parsed(server):
    server.script("m-judge", [Reply(text('{"label": "bug", '), text('"score": 0.5}'), finish("stop"))])
    run = execute(start_run("judge", "triage"))
    assert (run.status, run.output) == ("completed", {"label": "bug", "score": 0.5})
    text_format = server.requests_for("m-judge")[0]["responses"]["text"]["format"]
    assert (text_format["type"], text_format["name"]) == ("json_schema", "Verdict")
    assert text_format["schema"]["required"] == ["label", "score"]


def test_an_error_event_mid_stream_fails_the_run_keeping_the_text_so_far(server):
    server.script("m-thinker", [Reply(text("Partly"), error_event("the model is overloaded"))])
    run = execute(start_run("thinker", "x"))
    assert (run.status, run.error_code, run.error_message) == (
        "failed",
        "model_error",
        "the model is overloaded",
    )
    step = Step.objects.get(run=run)
    assert (step.output["text"], step.output["finish_reason"]) == ("Partly", "error")


@pytest.mark.parametrize("graceful", [False, True])
def test_a_cut_stream_fails_the_run_as_incomplete_and_runs_none_of_its_calls(server, graceful):
    server.script(
        "m-thinker", [Reply(reasoning("hm"), tool_call("c1", "refund", REFUND), cut(graceful=graceful))]
    )
    run = execute(start_run("thinker", "x"))
    assert (run.status, run.error_code) == ("failed", "incomplete_response")
    assert list(Step.objects.filter(run=run).values_list("kind", flat=True)) == ["llm"]
    assert Checkpoint.objects.get(run=run).messages[-1] == {"role": "assistant", "content": None}


def test_a_response_cut_short_by_its_token_limit_is_a_length_answer(server):
    server.script("m-thinker", [Reply(text("Half an ans"), finish("length"), usage(5, 5))])
    run = execute(start_run("thinker", "x"))
    assert (run.status, run.output) == ("completed", "Half an ans")
    assert Step.objects.get(run=run).output["finish_reason"] == "length"


def test_a_rate_limited_call_is_tried_again(server):
    server.script(
        "m-thinker", [Reply(http_error(429, "Rate limit reached")), Reply(text("Done."), finish("stop"))]
    )
    run = execute(start_run("thinker", "x"))
    assert (run.status, run.output, run.model_calls) == ("completed", "Done.", 1)
    assert len(server.requests_for("m-thinker")) == 2


def test_a_model_that_does_not_reason_is_asked_again_without_encrypted_reasoning_and_from_then_on(server):
    refused = http_error(400, "Encrypted content is not supported with this model.", param="include")
    server.script(
        "m-plain",
        [Reply(refused), Reply(text("Hi."), finish("stop")), Reply(text("Hi again."), finish("stop"))],
    )
    assert execute(start_run("plain", "hi")).output == "Hi."
    assert execute(start_run("plain", "hi")).output == "Hi again."
    asked = [r["responses"].get("include") for r in server.requests_for("m-plain")]
    assert asked == [["reasoning.encrypted_content"], None, None]


def test_a_call_id_the_provider_reuses_across_turns_answers_each_call_once(server):
    server.script(
        "m-thinker",
        [
            thinking_then("call_0", "add", '{"a": 1, "b": 2}'),
            thinking_then("call_0", "add", '{"a": 3, "b": 4}'),
            Reply(text("3 and 7."), finish("stop")),
        ],
    )
    run = execute(start_run("thinker", "two sums"))
    assert (run.status, run.output) == ("completed", "3 and 7.")
    assert list(Step.objects.filter(run=run, kind="tool").values_list("output", flat=True)) == [3, 7]
    last = sent(server, "m-thinker", 2)
    pairs = [(i["type"], i["call_id"], i.get("output")) for i in last if "call_id" in i]
    assert pairs == [
        ("function_call", "call_0", None),
        ("function_call_output", "call_0", "3"),
        ("function_call", "call_0", None),
        ("function_call_output", "call_0", "7"),
    ]


def test_a_call_id_repeated_within_a_turn_is_made_unique(server):
    server.script(
        "m-thinker",
        [
            Reply(
                tool_call("dup", "add", '{"a": 1, "b": 1}'),
                tool_call("dup", "add", '{"a": 2, "b": 2}'),
                finish("tool_calls"),
            ),
            Reply(text("2 and 4."), finish("stop")),
        ],
    )
    run = execute(start_run("thinker", "x"))
    assert run.status == "completed"
    calls = [i for i in sent(server, "m-thinker", 1) if i.get("type") == "function_call"]
    outputs = [i for i in sent(server, "m-thinker", 1) if i.get("type") == "function_call_output"]
    assert calls[0]["call_id"] == "dup" and calls[1]["call_id"] not in ("dup", "")
    assert [(o["call_id"], o["output"]) for o in outputs] == [
        (calls[0]["call_id"], "2"),
        (calls[1]["call_id"], "4"),
    ]


def test_chat_completions_are_not_sent_what_a_responses_turn_kept(server):
    # A thread may go on with an agent of the other API: the kept items stay out of its requests.
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello", RESPONSE_ITEMS: [{"type": "reasoning", "id": "rs_0"}]},
        {"role": "user", "content": "again"},
    ]
    server.script("m-chat", [Reply(text("Hi again"), finish("stop"))])
    turn = OpenAIModel().stream(ModelRequest("m-chat", history, []), lambda kind, text: None, AbortSignal())
    assert turn.text == "Hi again"
    assert server.requests_for("m-chat")[0]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "again"},
    ]
    assert history[1][RESPONSE_ITEMS], "the history itself is left as it was"
