"""The AG-UI endpoint (SPEC §15): POST chamvi/agui/<agent>/ with an AG-UI RunAgentInput streams the
run as AG-UI events, each checked against the ag-ui-protocol package's types; resume entries decide
its interrupts. The same authentication, policy and caps as the JSON API."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from ag_ui.core import Event

from chamvi_runs.models import EffectRecord, Run, WaitPoint
from tests.support.helpers import Api, anonymous_api, execute, make_user, session_api
from tests.support.scripted_server import Reply, finish, reasoning, text, tool_call, usage
from tests.support.sse_helpers import body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

EVENT = pydantic.TypeAdapter(Event)
REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def _request(thread: str, run_id: str, text_: str | None = "hello", **extra: Any) -> dict[str, Any]:
    messages = [] if text_ is None else [{"id": f"m-{run_id}", "role": "user", "content": text_}]
    return {"threadId": thread, "runId": run_id, "messages": messages, "tools": [], "context": [], **extra}


def _events(response: Any) -> list[dict[str, Any]]:
    """The AG-UI events of a streamed response, each validated by the ag-ui-protocol package."""
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    out = []
    for block in body(response).decode().split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data:
            event = json.loads("\n".join(data))
            EVENT.validate_python(event)
            out.append(event)
    return out


def _types(events: list[dict[str, Any]]) -> list[str]:
    """The event types, a run of content events as one: deltas close together go out merged."""
    types: list[str] = []
    for event in events:
        if not (event["type"].endswith("_CONTENT") and types and types[-1] == event["type"]):
            types.append(event["type"])
    return types


def _resume(api: Api, agent: str, thread: str, run_id: str, *entries: tuple[str, Any]) -> Any:
    """Resume interrupts: each entry is (interrupt id, payload), or (interrupt id, CANCELLED)."""
    resume = [
        {"interruptId": i, "status": "cancelled"}
        if p is CANCELLED
        else {"interruptId": i, "status": "resolved", "payload": p}
        for i, p in entries
    ]
    return api.post(f"/chamvi/agui/{agent}/", _request(thread, run_id, None, resume=resume))


CANCELLED = object()


def _start(api: Api, agent: str, request: dict[str, Any]) -> tuple[Any, Run]:
    response = api.post(f"/chamvi/agui/{agent}/", request)
    assert response.status_code == 200, response.content
    run = Run.objects.get(trigger_id=request["runId"])
    return response, execute(run)


@pytest.fixture
def alice() -> Api:
    return session_api(make_user("alice", "add_run", "approve_waitpoint"))


def test_a_new_message_starts_a_run_whose_text_and_tools_stream_as_agui_events(server, alice):
    server.script(
        "m-basic",
        [
            Reply(
                reasoning("Adding."),
                text("Let me add."),
                tool_call("c1", "add", '{"a": 2, "b": 3}'),
                finish("tool_calls"),
                usage(5, 5),
            ),
            Reply(text("It is "), text("5."), finish("stop"), usage(7, 3)),
        ],
    )
    response, run = _start(alice, "basic", _request("t-1", "agui-run-1", "what is 2+3?"))
    assert run.status == "completed" and run.thread == "t-1" and run.trigger["payload"] == "what is 2+3?"
    events = _events(response)
    assert _types(events) == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[0] == {"type": "RUN_STARTED", "threadId": "t-1", "runId": "agui-run-1"}
    first_message = events[6]["messageId"]
    start, args, _end, result = events[9:13]
    assert (start["toolCallId"], start["toolCallName"], start["parentMessageId"]) == (
        "c1",
        "add",
        first_message,
    )
    assert json.loads(args["delta"]) == {"a": 2, "b": 3}
    assert (result["toolCallId"], result["content"]) == ("c1", "5")
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == "Let me add.It is 5."
    assert events[-1]["outcome"] == {"type": "success"} and events[-1]["result"] == "It is 5."
    assert events[-1]["usage"][0]["inputTokens"] == 12


def test_an_approval_ends_the_agui_run_with_an_interrupt_and_a_resume_decides_it_and_follows_the_run(
    server, alice
):
    server.script(
        "m-approving",
        [Reply(text("Refunding."), tool_call("c9", "refund", REFUND), finish("tool_calls"))],
    )
    response, run = _start(alice, "approving", _request("t-2", "agui-2a", "refund o-1"))
    events = _events(response)
    assert _types(events)[-4:] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_FINISHED"]
    wait = WaitPoint.objects.get(run=run)
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    assert events[-1]["outcome"]["type"] == "interrupt"
    assert (interrupt["id"], interrupt["reason"], interrupt["toolCallId"]) == (
        wait.approval_id,
        "approval",
        "c9",
    )
    assert interrupt["responseSchema"]["required"] == ["approved"]
    assert json.loads(events[-3]["delta"]) == {"order_id": "o-1", "amount_cents": 500}

    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    resume = _request(
        "t-2",
        "agui-2b",
        None,
        resume=[
            {
                "interruptId": wait.approval_id,
                "status": "resolved",
                "payload": {"approved": True, "reason": "ok"},
            }
        ],
    )
    response = alice.post("/chamvi/agui/approving/", resume)
    assert response.status_code == 200, response.content
    run = execute(run)
    assert run.status == "completed" and EffectRecord.objects.filter(run=run).count() == 1
    events = _events(response)
    assert events[0] == {"type": "RUN_STARTED", "threadId": "t-2", "runId": "agui-2b"}
    # Only what the decision started: the refund's result (the client has its call from the
    # interrupt), then the answer.
    assert _types(events)[1:] == [
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[1]["toolCallId"] == "c9" and json.loads(events[1]["content"])["refunded"] == 500
    assert events[-1]["result"] == "Refunded."
    assert WaitPoint.objects.get(run=run).decision == "approved"


def test_a_question_is_an_interrupt_with_its_answer_schema_and_the_resume_payload_answers_it(server, alice):
    server.script(
        "m-asking", [Reply(tool_call("q1", "confirm", '{"question": "Ship today?"}'), finish("tool_calls"))]
    )
    response, run = _start(alice, "asking", _request("t-3", "agui-3a"))
    (interrupt,) = _events(response)[-1]["outcome"]["interrupts"]
    assert (interrupt["reason"], interrupt["message"], interrupt["responseSchema"]) == (
        "question",
        "Ship today?",
        {"type": "boolean"},
    )
    refused = _resume(alice, "asking", "t-3", "agui-3b", (interrupt["id"], [1, 2]))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_answer"
    server.script("m-asking", [Reply(text("Shipping today."), finish("stop"))])
    response = _resume(alice, "asking", "t-3", "agui-3c", (interrupt["id"], True))
    assert execute(run).status == "completed"
    events = _events(response)
    assert (events[1]["type"], events[1]["toolCallId"], events[1]["content"]) == (
        "TOOL_CALL_RESULT",
        "q1",
        "true",
    )
    assert events[-1]["result"] == "Shipping today."
    assert WaitPoint.objects.get(run=run).answer is True


def test_a_cancelled_interrupt_denies_the_call_and_a_failed_run_ends_with_run_error(server, alice):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    _response, run = _start(alice, "approving", _request("t-4", "agui-4a"))
    wait = WaitPoint.objects.get(run=run)
    server.script("m-approving", [Reply(text("partial"))])  # cut: no finish reason
    response = _resume(alice, "approving", "t-4", "agui-4b", (wait.approval_id, CANCELLED))
    run = execute(run)
    assert run.status == "failed" and WaitPoint.objects.get(run=run).decision == "denied"
    events = _events(response)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "incomplete_response"
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == "c1" and "denied" in result["content"]


def test_a_retried_request_follows_the_run_it_started_instead_of_starting_another(server, alice):
    server.script("m-basic", [Reply(text("Hi."), finish("stop"))])
    first, _run = _start(alice, "basic", _request("t-5", "agui-5"))
    again = alice.post("/chamvi/agui/basic/", _request("t-5", "agui-5"))
    assert Run.objects.filter(thread="t-5").count() == 1
    assert _types(_events(again)) == _types(_events(first))


@pytest.mark.parametrize(
    ("request_body", "status", "code", "says"),
    [
        ("not json", 400, "invalid_json", "not JSON"),
        ({"threadId": "t", "runId": "r"}, 400, "invalid_field", "messages"),
        (_request("t", "r", None), 400, "invalid_field", "must end with the user's message"),
        (
            {**_request("t", "r"), "messages": [{"id": "a", "role": "assistant", "content": "hi"}]},
            400,
            "invalid_field",
            "must end with the user's message",
        ),
        (_request("t", "r", " "), 400, "invalid_field", "empty"),
        (_request("t" * 201, "r"), 400, "invalid_field", "threadId"),
        (
            _request("t", "r", None, resume=[{"interruptId": "apr_nope", "status": "resolved"}]),
            404,
            "not_found",
            "apr_nope",
        ),
        (_request("t", "r", "x" * (300 * 1024)), 413, "payload_too_large", "payload"),
    ],
)
def test_bad_input_gets_a_clear_error_and_starts_nothing(alice, request_body, status, code, says):
    raw = request_body if isinstance(request_body, str) else None
    response = alice.post("/chamvi/agui/basic/", None if raw else request_body, raw=raw)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and says in error["message"]
    assert not Run.objects.exists()


def test_the_same_rules_as_the_json_api_who_may_start_and_whose_thread(server, alice):
    assert anonymous_api().post("/chamvi/agui/basic/", _request("t", "r")).status_code == 401
    assert alice.post("/chamvi/agui/no_such_agent/", _request("t", "r")).status_code == 404
    server.script("m-basic", [Reply(text("Hi."), finish("stop"))])
    _start(alice, "basic", _request("alice-thread", "agui-7a"))
    carol = session_api(make_user("carol"))
    refused = carol.post("/chamvi/agui/basic/", _request("t", "agui-7x"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    bob = session_api(make_user("bob", "add_run"))
    taken = bob.post("/chamvi/agui/basic/", _request("alice-thread", "agui-7b"))
    # A thread name is per user (the policy's scope): bob's is another thread than alice's.
    assert taken.status_code == 200
    assert Run.objects.get(trigger_id="agui-7b").created_by.username == "bob"
    wait_free = _resume(alice, "approving", "t-x", "agui-7c", ("apr_x", True))
    assert wait_free.status_code == 404


def test_the_documented_requests_start_a_run_and_resume_its_interrupt(server, alice):
    from tests.docsamples import block

    asked, resumed = json.loads(block("agui-request")), json.loads(block("agui-resume"))
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    response, run = _start(alice, "approving", asked)
    (interrupt,) = _events(response)[-1]["outcome"]["interrupts"]
    resumed["resume"][0]["interruptId"] = interrupt["id"]
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    response = alice.post("/chamvi/agui/approving/", resumed)
    assert execute(run).status == "completed" and _events(response)[-1]["result"] == "Refunded."
    assert WaitPoint.objects.get(run=run).reason == "photos checked"


def test_without_the_agui_extra_the_endpoint_says_what_to_install(alice, monkeypatch):
    from chamvi_runs.agui import views

    monkeypatch.setattr(views, "find_spec", lambda name: None)
    response = alice.post("/chamvi/agui/basic/", _request("t", "r"))
    assert response.status_code == 501 and "agui extra" in response.json()["error"]["message"]
    assert not Run.objects.exists()


def _two_questions(server: Any, alice: Api, thread: str) -> tuple[Run, list[dict[str, Any]]]:
    server.script(
        "m-asking",
        [
            Reply(
                tool_call("q1", "confirm", '{"question": "Ship today?"}'),
                tool_call("q2", "ask_user", '{"question": "Which box?"}'),
                finish("tool_calls"),
            )
        ],
    )
    response, run = _start(alice, "asking", _request(thread, f"{thread}-a"))
    return run, _events(response)[-1]["outcome"]["interrupts"]


def test_a_resume_decides_all_its_interrupts_or_none(server, alice):
    run, (first, second) = _two_questions(server, alice, "t-all")
    refused = _resume(alice, "asking", "t-all", "t-all-b", (first["id"], True), (second["id"], CANCELLED))
    assert refused.status_code == 400 and "is a question" in refused.json()["error"]["message"]
    twice = _resume(alice, "asking", "t-all", "t-all-c", (first["id"], True), (first["id"], False))
    assert twice.status_code == 400 and "twice" in twice.json()["error"]["message"]
    # A refusal of the store (the second answer does not fit) rolls back the first answer too.
    unfit = _resume(
        alice, "asking", "t-all", "t-all-d", (first["id"], True), (second["id"], {"not": "a string"})
    )
    assert unfit.status_code == 400 and unfit.json()["error"]["code"] == "invalid_answer"
    assert list(WaitPoint.objects.filter(run=run).values_list("decision", flat=True)) == [None, None]
    nul = _resume(alice, "asking", "t-all", "t-all-e", ("apr_\u0000", True))
    assert nul.status_code == 404


def test_answering_one_of_two_questions_ends_the_agui_run_at_once_with_the_other(server, alice):
    run, (first, second) = _two_questions(server, alice, "t-half")
    response = _resume(alice, "asking", "t-half", "t-half-b", (first["id"], True))
    events = _events(response)
    assert _types(events) == [
        "RUN_STARTED",
        "TOOL_CALL_RESULT",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    assert [i["id"] for i in events[-1]["outcome"]["interrupts"]] == [second["id"]]
    server.script("m-asking", [Reply(text("Shipping today, small box."), finish("stop"))])
    response = _resume(alice, "asking", "t-half", "t-half-c", (second["id"], "small"))
    assert execute(run).status == "completed"
    # Each answered call's result once, at the start: the run going on repeats neither call.
    assert _types(_events(response)) == [
        "RUN_STARTED",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]


def test_an_approval_a_delegated_run_asks_for_is_the_parents_interrupt(server):
    alice = session_api(make_user("alice-d", "add_run", "approve_waitpoint"))
    server.script(
        "m-triage", [Reply(tool_call("c1", "billing", '{"task": "refund o-1"}'), finish("tool_calls"))]
    )
    server.script("m-billing", [Reply(tool_call("r1", "refund", REFUND), finish("tool_calls"))])
    response, parent = _start(alice, "triage", _request("t-child", "t-child-a"))
    child = execute(Run.objects.get(parent=parent))
    assert child.status == "waiting"
    (interrupt,) = _events(response)[-1]["outcome"]["interrupts"]
    wait = WaitPoint.objects.get(run=child)
    assert (interrupt["id"], interrupt["toolCallId"], interrupt["metadata"]["run_id"]) == (
        wait.approval_id,
        "r1",
        child.pk,
    )
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"))])
    server.script("m-triage", [Reply(text("Billing refunded it."), finish("stop"))])
    response = _resume(alice, "triage", "t-child", "t-child-b", (wait.approval_id, True))
    assert response.status_code == 200, response.content
    assert execute(child).status == "completed" and execute(parent).status == "completed"
    events = _events(response)
    assert events[-1]["result"] == "Billing refunded it."
    assert [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"][-1] == "c1"
