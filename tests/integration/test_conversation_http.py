"""Questions and edited approvals over the web (SPEC §12): the JSON API (answer, approve with
``arguments``, the run's ``waits`` and decisions) and the websocket commands, in process and on a
real daphne with a real worker."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import django_rq
import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from chamvi_runs import start_run, store
from chamvi_runs.models import Run, WaitPoint
from tests.integration.test_websocket import command, headers_for, reply_to, run_path, socket
from tests.support.helpers import anonymous_api, events, execute, make_user, session_api, session_cookie
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.support.ws_client import Socket
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

RUNS = "/chamvi/api/runs/"
PROPOSED = {"order_id": "o-1", "amount_cents": 4599}
EDITED = {"order_id": "o-1", "amount_cents": 2000}
APPROVER_PERMS = ("chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")


# --- helpers --------------------------------------------------------------------------------------


def waiting(server, owner: Any, *calls: Any, agent: str = "asking") -> tuple[Run, list[WaitPoint]]:
    """A run of ``owner`` whose first model call made ``calls``, waiting; its open wait points."""
    server.script(f"m-{agent}", [Reply(*calls, finish("tool_calls"))])
    run = execute(start_run(agent, "help me", created_by=owner))
    assert run.status == "waiting", (run.status, run.error_code, run.error_message)
    django_rq.get_queue("chamvi").empty()  # its start job ran above, in this process
    return run, list(WaitPoint.objects.filter(run=run, decision__isnull=True).order_by("call_position"))


def question(server, owner: Any, tool: str = "choose_shipping") -> tuple[Run, WaitPoint]:
    run, (waitpoint,) = waiting(server, owner, tool_call("c1", tool, '{"question": "How?"}'))
    return run, waitpoint


def refund(server, owner: Any, agent: str = "asking") -> tuple[Run, WaitPoint]:
    run, (waitpoint,) = waiting(server, owner, tool_call("c1", "refund", json.dumps(PROPOSED)), agent=agent)
    return run, waitpoint


def url(waitpoint: WaitPoint | str, verb: str) -> str:
    approval_id = waitpoint if isinstance(waitpoint, str) else waitpoint.approval_id
    return f"/chamvi/api/approvals/{approval_id}/{verb}/"


def error_of(response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["message"]
    return body["error"]


def undecided(waitpoint: WaitPoint) -> bool:
    fresh = WaitPoint.objects.get(pk=waitpoint.pk)
    return fresh.decision is None and fresh.answer is None and fresh.approved_input is None


def finish_run(server, run: Run, agent: str = "asking") -> Run:
    server.script(f"m-{agent}", [Reply(text("Done."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


# --- answering over HTTP --------------------------------------------------------------------------


def test_the_runs_creator_answers_and_gets_the_answered_wait_point(server, new_user, queue):
    owner = new_user()
    run, waitpoint = question(server, owner)
    response = session_api(owner).post(url(waitpoint, "answer"), {"answer": {"speed": "express"}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["approval_id"] == waitpoint.approval_id and body["run_id"] == run.pk
    assert body["kind"] == "input" and body["decision"] == "answered"
    assert body["answer"] == {"speed": "express", "gift": False}
    assert body["question"] == "How?" and body["tool_name"] == "choose_shipping"
    assert body["answer_schema"]["properties"]["speed"]["enum"] == ["standard", "express"]
    assert body["approved_input"] is None and body["client"] is False
    assert "token" not in json.dumps(body)
    assert WaitPoint.objects.get(pk=waitpoint.pk).decided_by == owner
    assert Run.objects.get(pk=run.pk).status == "running"
    assert [job.args[0] for job in queue.get_jobs()] == [run.pk]
    finish_run(server, run)


def test_an_answer_the_schema_refuses_is_400_naming_the_field(server, new_user):
    owner = new_user()
    _, waitpoint = question(server, owner)
    response = session_api(owner).post(url(waitpoint, "answer"), {"answer": {"speed": "slow"}})
    error = error_of(response, 400)
    assert error["code"] == "invalid_answer" and "speed" in error["message"]
    assert undecided(waitpoint)


def test_a_second_answer_is_409(server, new_user):
    owner = new_user()
    run, waitpoint = question(server, owner, tool="ask_user")
    api = session_api(owner)
    assert api.post(url(waitpoint, "answer"), {"answer": "first"}).status_code == 200
    error = error_of(api.post(url(waitpoint, "answer"), {"answer": "second"}), 409)
    assert error["code"] == "already_decided"
    assert WaitPoint.objects.get(pk=waitpoint.pk).answer == "first"
    finish_run(server, run)


def test_an_expired_question_is_410(server, new_user):
    owner = new_user()
    _, waitpoint = question(server, owner, tool="ask_user")
    WaitPoint.objects.filter(pk=waitpoint.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    error = error_of(session_api(owner).post(url(waitpoint, "answer"), {"answer": "late"}), 410)
    assert error["code"] == "expired" and undecided(waitpoint)


@pytest.mark.parametrize("who", ["approver", "viewer"])
def test_only_the_runs_creator_answers_its_questions(server, new_user, who):
    owner = new_user()
    other = new_user(*APPROVER_PERMS) if who == "approver" else new_user("chamvi_runs.view_run")
    _, waitpoint = question(server, owner, tool="ask_user")
    error = error_of(session_api(other).post(url(waitpoint, "answer"), {"answer": "mine"}), 403)
    assert error["code"] == "forbidden"
    assert anonymous_api().post(url(waitpoint, "answer"), {"answer": "x"}).status_code == 401
    assert undecided(waitpoint)


def test_the_wait_points_token_answers_without_a_session(server, new_user):
    owner = new_user()
    run, waitpoint = question(server, owner, tool="ask_user")
    raw = store.reissue_token(waitpoint)
    bad = anonymous_api().post(url(waitpoint, "answer"), {"answer": "x", "token": "nope"})
    assert error_of(bad, 403)["code"] == "bad_token"
    response = anonymous_api().post(url(waitpoint, "answer"), {"answer": "by mail", "token": raw})
    assert response.status_code == 200, response.content
    assert response.json()["answer"] == "by mail"
    finish_run(server, run)


def test_an_answer_that_cannot_be_stored_is_400_and_null_is_an_answer(server, new_user):
    owner = new_user()
    run, waitpoint = question(server, owner, tool="browser_locale")
    api = session_api(owner)
    error = error_of(api.post(url(waitpoint, "answer"), {"answer": {"locale": "fr\u0000"}}), 400)
    assert error["code"] == "invalid_payload" and undecided(waitpoint)
    # A client question takes any JSON, null included (the page may know nothing).
    response = api.post(url(waitpoint, "answer"), {"answer": None})
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == "answered" and response.json()["answer"] is None
    finish_run(server, run)
    told = [m for m in server.requests_for("m-asking")[-1]["messages"] if m["role"] == "tool"]
    assert told[0]["content"] == "null"


def test_an_unknown_question_is_404(new_user):
    error = error_of(session_api(new_user()).post(url("apr_nope", "answer"), {"answer": "x"}), 404)
    assert error["code"] == "not_found"


@pytest.mark.parametrize(
    "body", [{}, {"answer": "x", "extra": 1}, {"reply": "x"}], ids=["missing", "unknown-field", "misnamed"]
)
def test_a_malformed_answer_request_is_400(server, new_user, body):
    owner = new_user()
    _, waitpoint = question(server, owner, tool="ask_user")
    error = error_of(session_api(owner).post(url(waitpoint, "answer"), body), 400)
    assert error["code"] == "invalid_field"
    assert undecided(waitpoint)


def test_answer_and_approve_are_each_refused_on_the_other_kind_with_409(server, new_user):
    owner = new_user(*APPROVER_PERMS)
    api = session_api(owner)
    _, approval = refund(server, owner)
    error = error_of(api.post(url(approval, "answer"), {"answer": "yes"}), 409)
    assert error["code"] == "wrong_kind" and undecided(approval)
    _, asked = question(server, owner, tool="confirm")
    for verb in ("approve", "deny"):
        assert error_of(api.post(url(asked, verb)), 409)["code"] == "wrong_kind"
    assert undecided(asked)


# --- approving with arguments over HTTP -----------------------------------------------------------


def test_approve_with_edited_arguments_runs_the_tool_with_them(server, new_user):
    approver = new_user(*APPROVER_PERMS)
    run, waitpoint = refund(server, new_user())
    response = session_api(approver).post(url(waitpoint, "approve"), {"reason": "part", "arguments": EDITED})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["decision"] == "approved" and body["kind"] == "approval"
    assert body["input"] == PROPOSED and body["approved_input"] == EDITED and body["answer"] is None
    assert body["editable"] is True
    run = finish_run(server, run)
    assert Refund.objects.get().amount_cents == 2000


@pytest.mark.parametrize(
    ("arguments", "status", "code"),
    [
        ({"order_id": "o-1", "amount_cents": "lots"}, 400, "invalid_arguments"),
        ([1, 2], 400, "invalid_field"),
        ("o-1", 400, "invalid_field"),
    ],
    ids=["schema", "list", "string"],
)
def test_approve_with_arguments_that_do_not_fit_is_400(server, new_user, arguments, status, code):
    approver = new_user(*APPROVER_PERMS)
    run, waitpoint = refund(server, new_user())
    body = {"arguments": arguments}
    error = error_of(session_api(approver).post(url(waitpoint, "approve"), body), status)
    assert error["code"] == code
    if code == "invalid_arguments":
        assert "amount_cents" in error["message"]
    assert undecided(waitpoint) and Run.objects.get(pk=run.pk).status == "waiting"


def test_approve_with_arguments_of_a_locked_tool_is_400_not_editable(server, new_user):
    approver = new_user(*APPROVER_PERMS)
    _, waitpoint = refund(server, new_user(), agent="editing_locked")
    body = {"arguments": EDITED}
    error = error_of(session_api(approver).post(url(waitpoint, "approve"), body), 400)
    assert error["code"] == "not_editable" and undecided(waitpoint)


def test_deny_takes_no_arguments(server, new_user):
    approver = new_user(*APPROVER_PERMS)
    _, waitpoint = refund(server, new_user())
    error = error_of(session_api(approver).post(url(waitpoint, "deny"), {"arguments": EDITED}), 400)
    assert error["code"] == "invalid_field" and undecided(waitpoint)


# --- the run's JSON -------------------------------------------------------------------------------


def test_run_json_lists_every_open_question_then_the_decisions(server, new_user):
    owner = new_user()
    run, (first, second) = waiting(
        server,
        owner,
        tool_call("c1", "ask_user", '{"question": "Your name?"}'),
        tool_call("c2", "confirm", '{"question": "Subscribe?"}'),
        agent="asking_two",
    )
    api = session_api(owner)
    body = api.get(f"{RUNS}{run.pk}/").json()
    assert body["status"] == "waiting"
    waits = body["waits"]
    assert [w["approval_id"] for w in waits] == [first.approval_id, second.approval_id]
    assert [(w["kind"], w["tool_name"], w["question"]) for w in waits] == [
        ("input", "ask_user", "Your name?"),
        ("input", "confirm", "Subscribe?"),
    ]
    assert [w["answer_schema"] for w in waits] == [{"type": "string"}, {"type": "boolean"}]
    assert all(w["client"] is False and w["answer"] is None and w["decision"] is None for w in waits)
    assert body["waiting"] == waits[0]
    assert body["decisions"] == []

    api.post(url(second, "answer"), {"answer": True})
    body = api.get(f"{RUNS}{run.pk}/").json()
    assert [w["approval_id"] for w in body["waits"]] == [first.approval_id]
    assert body["waiting"]["approval_id"] == first.approval_id and body["status"] == "waiting"
    assert [(d["kind"], d["decision"], d["answer"]) for d in body["decisions"]] == [
        ("input", "answered", True)
    ]

    api.post(url(first, "answer"), {"answer": "Ada"})
    run = finish_run(server, run, agent="asking_two")
    body = api.get(f"{RUNS}{run.pk}/").json()
    assert body["waits"] == [] and body["waiting"] is None
    decisions = {d["approval_id"]: d for d in body["decisions"]}
    assert decisions[first.approval_id]["answer"] == "Ada"
    assert decisions[first.approval_id]["input"] == {"question": "Your name?"}
    assert decisions[second.approval_id]["answer"] is True
    assert all(d["approved_input"] is None and d["decided_by"] == owner.username for d in decisions.values())


def test_run_json_decisions_show_the_edited_arguments(server, new_user):
    owner = new_user(*APPROVER_PERMS)
    run, waitpoint = refund(server, owner)
    api = session_api(owner)
    assert api.post(url(waitpoint, "approve"), {"arguments": EDITED}).status_code == 200
    run = finish_run(server, run)
    (decision,) = api.get(f"{RUNS}{run.pk}/").json()["decisions"]
    assert (decision["kind"], decision["decision"]) == ("approval", "approved")
    assert decision["input"] == PROPOSED and decision["approved_input"] == EDITED
    assert decision["answer"] is None


# --- websocket commands (in process) --------------------------------------------------------------


def test_answer_over_the_socket_is_acked_and_the_run_goes_on(server):
    owner = make_user("owner")
    run, waitpoint = question(server, owner, tool="ask_user")
    message = {"type": "answer", "approval_id": waitpoint.approval_id, "answer": "Blue"}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), message)
    assert reply == {"type": "ack", "action": "answer", "approval_id": waitpoint.approval_id}
    decided = WaitPoint.objects.get(pk=waitpoint.pk)
    assert (decided.decision, decided.answer, decided.decided_by_id) == ("answered", "Blue", owner.pk)
    finish_run(server, run)
    told = [m for m in server.requests_for("m-asking")[-1]["messages"] if m["role"] == "tool"]
    assert told[0]["content"] == "Blue"


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"answer": {"speed": "slow"}}, "invalid_answer"),
        ({}, "invalid_message"),
        ({"approval_id": 7, "answer": "x"}, "invalid_message"),
        ({"approval_id": "apr_nope", "answer": {"speed": "express"}}, "not_found"),
    ],
    ids=["schema", "no-answer", "bad-id", "unknown"],
)
def test_a_refused_answer_over_the_socket_is_an_error_reply(server, message, code):
    owner = make_user("owner")
    run, waitpoint = question(server, owner)
    sent = {"type": "answer", "approval_id": waitpoint.approval_id, **message}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), sent)
    assert reply["type"] == "error" and reply["code"] == code, reply
    if code == "invalid_answer":
        assert "speed" in reply["message"]
    assert undecided(waitpoint)


def test_an_answer_over_the_socket_by_an_approver_who_did_not_start_the_run_is_forbidden(server):
    owner, approver = make_user("owner"), make_user("approver", *APPROVER_PERMS)
    run, waitpoint = question(server, owner, tool="ask_user")
    message = {"type": "answer", "approval_id": waitpoint.approval_id, "answer": "theirs"}
    reply = async_to_sync(command)(run_path(run), headers_for(approver), message)
    assert reply["type"] == "error" and reply["code"] == "forbidden"
    assert undecided(waitpoint)


def test_the_wrong_verb_over_the_socket_is_wrong_kind(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = refund(server, owner)
    message = {"type": "answer", "approval_id": waitpoint.approval_id, "answer": "yes"}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), message)
    assert reply["type"] == "error" and reply["code"] == "wrong_kind"
    asked_run, asked = question(server, owner, tool="confirm")
    reply = async_to_sync(command)(
        run_path(asked_run), headers_for(owner), {"type": "approve", "approval_id": asked.approval_id}
    )
    assert reply["type"] == "error" and reply["code"] == "wrong_kind"
    assert undecided(waitpoint) and undecided(asked)


def test_approve_with_arguments_over_the_socket_runs_the_tool_with_them(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = refund(server, owner)
    headers = headers_for(owner)

    async def scenario() -> list[dict[str, Any]]:
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        replies = []
        for arguments in ({"order_id": "o-1", "amount_cents": "lots"}, "not an object", EDITED):
            await comm.send_json_to(
                {"type": "approve", "approval_id": waitpoint.approval_id, "arguments": arguments}
            )
            replies.append(await reply_to(comm))
        await comm.disconnect()
        return replies

    invalid, malformed, ack = async_to_sync(scenario)()
    assert invalid["type"] == "error" and invalid["code"] == "invalid_arguments"
    assert "amount_cents" in invalid["message"]
    assert malformed["type"] == "error" and malformed["code"] == "invalid_message"
    assert ack == {"type": "ack", "action": "approve", "approval_id": waitpoint.approval_id}
    assert WaitPoint.objects.get(pk=waitpoint.pk).approved_input == EDITED
    finish_run(server, run)
    assert Refund.objects.get().amount_cents == 2000


def test_approve_with_arguments_of_a_locked_tool_over_the_socket_is_not_editable(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = refund(server, owner, agent="editing_locked")
    message = {"type": "approve", "approval_id": waitpoint.approval_id, "arguments": EDITED}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), message)
    assert reply["type"] == "error" and reply["code"] == "not_editable"
    assert undecided(waitpoint)


# --- a real daphne and a real worker --------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_question_and_an_edited_approval_over_a_socket_on_daphne_with_a_worker(server):
    """The page answers the question and approves an edited refund on its socket; the worker resumes
    the run each time and the socket sees everything up to run.end."""
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    server.script(
        "m-asking",
        [
            Reply(tool_call("c1", "ask_user", '{"question": "Which order?"}'), finish("tool_calls")),
            Reply(tool_call("c2", "refund", json.dumps(PROPOSED)), finish("tool_calls")),
            Reply(text("Refunded 20.00."), finish("stop")),
        ],
    )
    env = worker_env(server.base_url)
    web, worker = WebProcess(env), WorkerProcess(env)
    try:
        wait_for(worker.ready, 60, worker.output)
        run = start_run("asking", "refund my order", created_by=owner)
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "waiting", 60, worker.output)
        cookie = session_cookie(owner)

        async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
            ws = await Socket.open(web.port, f"/ws/chamvi/runs/{run.pk}/?after=0", cookie)
            asked = await ws.until("run.waiting", timeout=30)
            ws.send({"type": "answer", "approval_id": asked[-1]["approval_id"], "answer": "o-1"})
            proposed = await ws.until("run.waiting", timeout=60)
            ws.send({"type": "approve", "approval_id": proposed[-1]["approval_id"], "arguments": EDITED})
            ended = await ws.until("run.end", timeout=60)
            await ws.close()
            return asked, proposed, ended

        asked, proposed, ended = async_to_sync(scenario)()
    finally:
        worker.stop()
        web.stop()
    assert asked[-1]["kind"] == "input" and asked[-1]["question"] == "Which order?"
    acks = [m for m in proposed + ended if m["type"] == "ack"]
    assert [a["action"] for a in acks] == ["answer", "approve"]
    answered = next(e for e in proposed if e["type"] == "tool.result")
    assert (answered["tool_call_id"], answered["output"]) == ("c1", "o-1")
    assert proposed[-1]["kind"] == "approval" and proposed[-1]["input"] == PROPOSED
    assert proposed[-1]["editable"] is True
    ran = next(e for e in ended if e["type"] == "tool.call")
    assert ran["tool_call_id"] == "c2" and ran["input"] == EDITED
    assert ended[-1]["status"] == "completed"
    assert [(d["kind"], d["answer"], d["approved_input"]) for d in ended[-1]["decisions"]] == [
        ("input", "o-1", None),
        ("approval", None, EDITED),
    ]
    assert Refund.objects.get().amount_cents == 2000
    assert [e for e in asked + proposed + ended if "seq" in e] == events(run)
