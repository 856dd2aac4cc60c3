"""Regenerate, resend and forks (SPEC §12): a new run of the thread from the history a run started
from (or from the history after one of a run's steps), in Python, over HTTP and over the websocket
(in process, and on a real daphne with a real worker). What the model is sent is read from the
scripted server's recorded requests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from chamvi_runs import approve, cancel_run, regenerate, resend, start_run
from chamvi_runs.errors import (
    DecisionRefused,
    HistoryUnavailable,
    InvalidPayload,
    RunNotFound,
    ThreadForbidden,
)
from chamvi_runs.models import Checkpoint, EffectRecord, Run, WaitPoint
from chamvi_runs.runtime.start_point import FORKED_BEFORE
from chamvi_runs.streaming import replay
from tests.integration.test_history_parts import checkpoint, sent, turns
from tests.integration.test_websocket import command, headers_for, run_path
from tests.support.helpers import events, execute, make_user, session_api, session_cookie
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, delay, finish, text, tool_call
from tests.support.ws_client import Socket
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

MODEL = "m-basic"
STARTER = ("chamvi_runs.add_run",)


# --- helpers --------------------------------------------------------------------------------------


def answered(
    server, payload: Any, answer: str, *, thread: str | None = "t", owner: Any = None, **kwargs
) -> Run:
    """A completed run of ``basic`` that answered ``answer``."""
    server.script(MODEL, [Reply(text(answer), finish("stop"))])
    run = execute(start_run("basic", payload, thread=thread, created_by=owner, **kwargs))
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def again(server, new: Run, answer: str) -> Run:
    """Execute a run a regenerate, a resend or a fork created; it answers ``answer``."""
    server.script(MODEL, [Reply(text(answer), finish("stop"))])
    run = execute(new)
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def payload_of(message: dict[str, Any]) -> Any:
    """The trigger payload a trigger message carries."""
    content = message["content"]
    return json.loads(content[0]["text"] if isinstance(content, list) else content)["payload"]


def spoken(history: list[dict[str, Any]]) -> list[Any]:
    """A history as what was said: each trigger's payload and each answer's text."""
    said = []
    for message in history:
        if message["role"] == "user":
            said.append(payload_of(message))
        elif message["role"] == "assistant":
            said.append(message.get("content"))
    return said


def last_sent(server) -> list[Any]:
    return spoken(sent(server)[-1])


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.content
    return response.json()["error"]["code"]


def regenerate_url(run: Run | str, verb: str = "regenerate") -> str:
    return f"/chamvi/api/runs/{getattr(run, 'pk', run)}/{verb}/"


def start_event(run: Run) -> dict[str, Any]:
    return next(e for e in events(run) if e["type"] == "run.start")


# --- regenerate and resend in Python --------------------------------------------------------------


def test_regenerate_answers_again_from_the_history_the_run_started_from(server):
    owner = make_user("owner")
    answered(server, "q1", "a1", owner=owner)
    old = answered(server, {"q": 2}, "a2 old", owner=owner, keys={"k": "v"})
    first_request = sent(server)[-1]

    new = regenerate(old.pk)
    assert new.pk != old.pk and new.status == "queued"
    assert (new.agent, new.thread, new.created_by_id) == ("basic", "t", owner.pk)
    assert new.trigger["payload"] == {"q": 2} and new.trigger["keys"] == {"k": "v"}
    assert new.replaces_id == old.pk and (new.base_id, new.base_step) == (old.pk, -1)
    new = again(server, new, "a2 new")
    # The model is asked exactly what it was asked the first time: no trace of its old answer.
    assert sent(server)[-1] == first_request
    assert "a2 old" not in json.dumps(sent(server)[-1])
    assert start_event(new)["replaces"] == old.pk and start_event(new)["replaced_by"] is None
    assert start_event(new)["forked_from"] is None
    # The thread goes on from the new run, never from the one it replaced.
    answered(server, "q3", "a3", owner=owner)
    assert last_sent(server) == ["q1", "a1", {"q": 2}, "a2 new", "q3"]


def test_a_regenerate_another_user_asks_for_stays_the_conversations_users(server):
    """An operator who regenerates for a customer: the customer still sees, and goes on from, the
    new answer."""
    owner, helper = make_user("owner"), make_user("helper", "chamvi_runs.view_run")
    old = answered(server, "q", "a", owner=owner)
    assert regenerate(old.pk, by=helper).created_by_id == owner.pk


def test_the_replaced_run_names_its_replacement_in_its_json_and_its_rebuilt_events(server):
    owner = make_user("owner")
    old = answered(server, "q", "a old", owner=owner)
    new = again(server, regenerate(old.pk), "a new")
    api = session_api(owner)
    replaced = api.get(f"/chamvi/api/runs/{old.pk}/").json()
    assert (replaced["replaces"], replaced["replaced_by"], replaced["forked_from"]) == (None, new.pk, None)
    replacing = api.get(f"/chamvi/api/runs/{new.pk}/").json()
    assert (replacing["replaces"], replacing["replaced_by"], replacing["forked_from"]) == (old.pk, None, None)
    # A stream that rebuilds the old run's events from its steps says what replaced it.
    rebuilt = replay.rebuild(Run.objects.get(pk=old.pk)).events[0]
    assert rebuilt["type"] == "run.start" and rebuilt["replaced_by"] == new.pk
    # A second regenerate of the same run: the newest replacement is named.
    newer = again(server, regenerate(old.pk), "a newer")
    assert api.get(f"/chamvi/api/runs/{old.pk}/").json()["replaced_by"] == newer.pk


def test_resend_of_an_earlier_run_drops_the_runs_after_it_from_the_thread(server):
    owner = make_user("owner")
    answered(server, "q1", "a1", owner=owner)
    second = answered(server, "q2", "a2", owner=owner)
    answered(server, "q3", "a3", owner=owner)
    answered(server, "q4", "a4", owner=owner)

    edited = resend(second.pk, "q2 edited")
    assert edited.trigger["payload"] == "q2 edited" and edited.replaces_id == second.pk
    again(server, edited, "a2 edited")
    assert last_sent(server) == ["q1", "a1", "q2 edited"]
    answered(server, "q5", "a5", owner=owner)
    history = last_sent(server)
    assert history == ["q1", "a1", "q2 edited", "a2 edited", "q5"]
    for gone in ("q2", "a2", "q3", "a3", "q4", "a4"):
        assert gone not in history


def test_resend_refuses_a_payload_that_cannot_be_stored(server):
    old = answered(server, "q", "a")
    with pytest.raises(InvalidPayload):
        resend(old.pk, "bad \x00 text")
    assert not Run.objects.filter(replaces=old).exists()


def test_regenerating_a_regenerated_run_answers_from_where_both_started(server):
    owner = make_user("owner")
    answered(server, "q1", "a1", owner=owner)
    first = answered(server, "q2", "a2", owner=owner)
    second = again(server, regenerate(first.pk), "a2 second")
    again(server, regenerate(second.pk), "a2 third")
    assert last_sent(server) == ["q1", "a1", "q2"]
    answered(server, "q3", "a3", owner=owner)
    assert last_sent(server) == ["q1", "a1", "q2", "a2 third", "q3"]


def test_effects_of_a_replaced_run_are_not_undone(server):
    owner = make_user("owner")
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o-9", "amount_cents": 900}'), finish("tool_calls"))],
    )
    old = execute(start_run("approving", "refund o-9", thread="t-fx", created_by=owner))
    approve(WaitPoint.objects.get(run=old).approval_id)
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    assert execute(old).status == "completed"
    assert Refund.objects.count() == 1

    server.script("m-approving", [Reply(text("I would rather not refund."), finish("stop"))])
    new = execute(regenerate(old.pk))
    assert new.status == "completed" and new.replaces_id == old.pk
    refund = Refund.objects.get()
    assert (refund.order_id, refund.amount_cents) == ("o-9", 900)
    assert (
        EffectRecord.objects.filter(run=old).count() == 1
        and not EffectRecord.objects.filter(run=new).exists()
    )


@pytest.mark.parametrize("status", ["queued", "running", "waiting"])
def test_only_a_settled_run_is_regenerated(server, status):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner)
    Run.objects.filter(pk=old.pk).update(status=status, finished_at=None)
    with pytest.raises(DecisionRefused) as refused:
        regenerate(old.pk)
    assert refused.value.code == "run_active"
    with pytest.raises(DecisionRefused):
        resend(old.pk, "edited")
    response = session_api(owner).post(regenerate_url(old))
    assert error_of(response, 409) == "run_active"
    response = session_api(owner).post(regenerate_url(old, "resend"), {"payload": "edited"})
    assert error_of(response, 409) == "run_active"
    assert Run.objects.filter(thread="t").count() == 1


def test_a_run_that_saved_no_step_has_no_history_to_start_again_from(server):
    owner = make_user("owner", *STARTER)
    queued = start_run("basic", "never ran", thread="t", created_by=owner)
    assert cancel_run(queued.pk) == "cancelled"
    with pytest.raises(HistoryUnavailable):
        regenerate(queued.pk)
    response = session_api(owner).post(regenerate_url(queued))
    assert error_of(response, 409) == "history_unavailable"
    assert error_of(session_api(owner).post(regenerate_url(queued, "resend"), {"payload": "x"}), 409) == (
        "history_unavailable"
    )
    assert Run.objects.count() == 1


def test_an_unknown_run_is_not_found():
    with pytest.raises(RunNotFound):
        regenerate("run_nope")
    with pytest.raises(RunNotFound):
        resend("run_nope", "x")


def test_a_regenerate_by_someone_who_may_not_view_the_thread_is_refused(server):
    owner, stranger = make_user("owner"), make_user("stranger")
    old = answered(server, "q", "a", owner=owner)
    with pytest.raises(ThreadForbidden):
        regenerate(old.pk, by=stranger)
    assert Run.objects.count() == 1


def test_a_regenerate_cancelled_before_it_ran_does_not_bring_back_the_replaced_answer(server):
    """The user takes an answer back, then cancels the new run before it saved anything: the
    thread's next run does not go on from the answer taken back (the branch no longer holds it)."""
    owner = make_user("owner")
    answered(server, "q1", "a1", owner=owner)
    old = answered(server, "q2", "a2 taken back", owner=owner)
    new = regenerate(old.pk)
    assert cancel_run(new.pk) == "cancelled"
    answered(server, "q3", "a3", owner=owner)
    assert "a2 taken back" not in last_sent(server)


def test_a_regenerate_whose_model_call_failed_is_where_the_thread_goes_on(server):
    owner = make_user("owner")
    answered(server, "q1", "a1", owner=owner)
    old = answered(server, "q2", "a2 taken back", owner=owner)
    failed = execute(regenerate(old.pk))  # no reply is scripted: the model call fails
    assert failed.status == "failed" and failed.error_code == "model_error"
    answered(server, "q3", "a3", owner=owner)
    assert "a2 taken back" not in last_sent(server)
    assert last_sent(server)[:3] == ["q1", "a1", "q2"]


# --- forks ----------------------------------------------------------------------------------------


def _two_turns(server, owner: Any = None) -> tuple[Run, list[list[dict[str, Any]]]]:
    """A completed run: add (step 0), its result (1), add twice (2), results (3, 4), answer (5)."""
    server.script(MODEL, turns(2))
    run = execute(start_run("basic", "count", created_by=owner))
    assert run.status == "completed"
    return run, sent(server)


def test_a_fork_after_a_step_starts_from_the_history_after_that_step(server):
    source, _ = _two_turns(server)
    after = checkpoint(source).history(3)
    fork = start_run("basic", "what if?", thread="t-fork", from_step=(source.pk, 3))
    assert (fork.base_id, fork.base_step, fork.replaces_id) == (source.pk, 3, None)
    # The open second call of step 2 never ran in the fork: the model is told so.
    fork = again(server, fork, "forked")
    request = sent(server)[-1]
    assert request[: len(after)] == after
    assert request[len(after)] == {"role": "tool", "tool_call_id": "c1b", "content": FORKED_BEFORE}
    assert payload_of(request[-1]) == "what if?" and len(request) == len(after) + 2
    assert start_event(fork)["forked_from"] == {"run_id": source.pk, "step": 3}
    assert start_event(fork)["replaces"] is None


def test_a_fork_after_a_model_call_with_open_tool_calls_closes_them(server):
    source, _ = _two_turns(server)
    fork = again(server, start_run("basic", "instead", from_step=(source.pk, 2)), "forked")
    request = sent(server)[-1]
    after = checkpoint(source).history(2)
    assert request[: len(after)] == after
    assert request[len(after) : len(after) + 2] == [
        {"role": "tool", "tool_call_id": "c1", "content": FORKED_BEFORE},
        {"role": "tool", "tool_call_id": "c1b", "content": FORKED_BEFORE},
    ]
    assert fork.status == "completed"


@pytest.mark.parametrize("index", [-1, 1, 5])
def test_a_fork_at_each_kind_of_point_sends_that_history_then_its_trigger(server, index):
    source, requests = _two_turns(server)
    expected = {-1: [], 1: requests[1], 5: checkpoint(source).messages}[index]
    again(server, start_run("basic", "fork", from_step=(source.pk, index)), "forked")
    request = sent(server)[-1]
    assert request[:-1] == expected and payload_of(request[-1]) == "fork"


def test_a_fork_over_http_is_a_run_forked_from_that_step(server):
    owner = make_user("owner", *STARTER)
    source, requests = _two_turns(server, owner)
    api = session_api(owner)
    response = api.post(
        "/chamvi/api/runs/", {"agent": "basic", "payload": "again", "from_step": [source.pk, 1]}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["forked_from"] == {"run_id": source.pk, "step": 1}
    assert body["replaces"] is None and body["replaced_by"] is None
    again(server, Run.objects.get(pk=body["id"]), "forked")
    assert sent(server)[-1][:-1] == requests[1]


@pytest.mark.parametrize(
    "from_step",
    [
        ["run"],
        "run",
        {"run_id": "run", "step": 0},
        ["RUN", "1"],
        ["RUN", -2],
        ["RUN", True],
        ["RUN", 1.5],
        [7, 0],
    ],
    ids=["short", "string", "object", "string-index", "below-start", "bool", "float", "id-not-string"],
)
def test_an_invalid_from_step_over_http_is_400(server, from_step):
    owner = make_user("owner", *STARTER)
    source, _ = _two_turns(server, owner)
    value = json.loads(json.dumps(from_step).replace('"RUN"', json.dumps(source.pk)))
    response = session_api(owner).post(
        "/chamvi/api/runs/", {"agent": "basic", "payload": "x", "from_step": value}
    )
    assert error_of(response, 400) == "invalid_field"
    assert Run.objects.count() == 1


def test_a_fork_of_a_step_the_run_does_not_have_is_409_history_unavailable(server):
    owner = make_user("owner", *STARTER)
    source, _ = _two_turns(server, owner)
    response = session_api(owner).post(
        "/chamvi/api/runs/", {"agent": "basic", "payload": "x", "from_step": [source.pk, 6]}
    )
    assert error_of(response, 409) == "history_unavailable"
    assert Run.objects.count() == 1


def test_a_fork_of_a_run_the_user_may_not_view_is_404(server):
    owner, stranger = make_user("owner"), make_user("stranger", *STARTER)
    source, _ = _two_turns(server, owner)
    api = session_api(stranger)
    for run_id in (source.pk, "run_nope"):
        response = api.post("/chamvi/api/runs/", {"agent": "basic", "payload": "x", "from_step": [run_id, 0]})
        assert error_of(response, 404) == "not_found"
    assert Run.objects.count() == 1


def test_invalid_from_step_in_python(server):
    source, _ = _two_turns(server)
    for bad in ((source.pk,), (source.pk, "1"), (source.pk, -2), (source.pk, True), [source.pk, 1, 2]):
        with pytest.raises(InvalidPayload):
            start_run("basic", "x", from_step=bad)
    with pytest.raises(RunNotFound):
        start_run("basic", "x", from_step=("run_nope", 0))
    with pytest.raises(HistoryUnavailable):
        start_run("basic", "x", from_step=(source.pk, 6))
    never = start_run("basic", "never ran")
    with pytest.raises(HistoryUnavailable):
        start_run("basic", "x", from_step=(never.pk, -1))
    assert Run.objects.count() == 2


# --- over HTTP -------------------------------------------------------------------------------------


def test_regenerate_over_http_is_201_with_the_new_run(server):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a old", owner=owner)
    response = session_api(owner).post(regenerate_url(old))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "queued" and body["replaces"] == old.pk and body["forked_from"] is None
    assert body["trigger"]["payload"] == "q" and body["thread"] == "t"
    new = Run.objects.get(pk=body["id"])
    assert new.created_by_id == owner.pk
    assert Run.objects.get(pk=old.pk).replaced_by.get() == new


def test_resend_over_http_is_201_with_the_new_payload(server):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner)
    response = session_api(owner).post(regenerate_url(old, "resend"), {"payload": {"edited": True}})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["replaces"] == old.pk and body["trigger"]["payload"] == {"edited": True}
    again(server, Run.objects.get(pk=body["id"]), "a edited")
    assert last_sent(server) == [{"edited": True}]


@pytest.mark.parametrize(
    ("verb", "body"),
    [("regenerate", {"payload": "x"}), ("resend", {}), ("resend", {"payload": "x", "thread": "t2"})],
    ids=["regenerate-with-body", "resend-without-payload", "resend-unknown-field"],
)
def test_a_malformed_regenerate_or_resend_is_400(server, verb, body):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner)
    assert error_of(session_api(owner).post(regenerate_url(old, verb), body), 400) == "invalid_field"
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    ("perms", "status", "code"),
    [
        ((), 404, "not_found"),
        (("chamvi_runs.view_run", "chamvi_runs.add_run"), 403, "forbidden"),
        (("chamvi_runs.view_run", "chamvi_runs.change_run"), 403, "forbidden"),
    ],
    ids=["stranger", "viewer", "steerer-who-may-not-start"],
)
@pytest.mark.parametrize("verb", ["regenerate", "resend"])
def test_regenerate_of_someone_elses_run_is_refused(server, perms, status, code, verb):
    owner, other = make_user("owner", *STARTER), make_user("other", *perms)
    old = answered(server, "q", "a", owner=owner)
    body = {"payload": "mine"} if verb == "resend" else None
    assert error_of(session_api(other).post(regenerate_url(old, verb), body), status) == code
    assert Run.objects.count() == 1


def test_the_owner_needs_the_right_to_start_runs(server):
    owner = make_user("owner")
    old = answered(server, "q", "a", owner=owner)
    assert error_of(session_api(owner).post(regenerate_url(old)), 403) == "forbidden"


def test_a_user_who_may_view_steer_and_start_regenerates_anothers_run(server):
    owner = make_user("owner", *STARTER)
    staff = make_user("staff", "chamvi_runs.view_run", "chamvi_runs.change_run", "chamvi_runs.add_run")
    old = answered(server, "q", "a", owner=owner)
    response = session_api(staff).post(regenerate_url(old))
    assert response.status_code == 201, response.content
    assert Run.objects.get(pk=response.json()["id"]).created_by_id == owner.pk


# --- over the websocket ------------------------------------------------------------------------------


def test_regenerate_and_resend_on_a_thread_socket_ack_with_the_new_run(server):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner, thread="t-ws")
    path, headers = "/ws/chamvi/threads/t-ws/", headers_for(owner)
    reply = async_to_sync(command)(path, headers, {"type": "regenerate", "run_id": old.pk})
    new = Run.objects.get(replaces=old)
    assert reply == {"type": "ack", "action": "regenerate", "run_id": new.pk, "replaces": old.pk}
    again(server, new, "a again")
    reply = async_to_sync(command)(path, headers, {"type": "resend", "run_id": new.pk, "payload": "q edited"})
    edited = Run.objects.get(replaces=new)
    assert reply == {"type": "ack", "action": "resend", "run_id": edited.pk, "replaces": new.pk}
    assert edited.trigger["payload"] == "q edited" and edited.created_by_id == owner.pk


def test_regenerate_on_a_run_socket_regenerates_its_run(server):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner)
    reply = async_to_sync(command)(run_path(old), headers_for(owner), {"type": "regenerate"})
    assert reply == {
        "type": "ack",
        "action": "regenerate",
        "run_id": Run.objects.get(replaces=old).pk,
        "replaces": old.pk,
    }


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"type": "regenerate"}, "not_found"),
        ({"type": "regenerate", "run_id": "run_nope"}, "not_found"),
        ({"type": "resend", "run_id": "OLD"}, "invalid_message"),
        ({"type": "regenerate", "run_id": "ACTIVE"}, "run_active"),
        ({"type": "resend", "run_id": "UNSAVED", "payload": "x"}, "history_unavailable"),
    ],
    ids=["no-run-id", "unknown", "resend-without-payload", "active", "nothing-saved"],
)
def test_a_refused_regenerate_on_a_thread_socket_is_an_error_reply(server, message, code):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a", owner=owner, thread="t-ws")
    active = start_run("basic", "running", thread="t-ws", created_by=owner)
    unsaved = start_run("basic", "cancelled", thread="t-ws", created_by=owner)
    cancel_run(unsaved.pk)
    ids = {"OLD": old.pk, "ACTIVE": active.pk, "UNSAVED": unsaved.pk}
    sent_message = dict(message)
    if "run_id" in message:
        sent_message["run_id"] = ids.get(message["run_id"], message["run_id"])
    reply = async_to_sync(command)("/ws/chamvi/threads/t-ws/", headers_for(owner), sent_message)
    assert reply["type"] == "error" and reply["code"] == code, reply
    assert not Run.objects.filter(replaces__isnull=False).exists()


def test_a_regenerate_on_a_socket_by_a_viewer_who_may_not_steer_is_forbidden(server):
    owner, viewer = make_user("owner", *STARTER), make_user("viewer", "chamvi_runs.view_run", *STARTER)
    old = answered(server, "q", "a", owner=owner)
    reply = async_to_sync(command)(run_path(old), headers_for(viewer), {"type": "regenerate"})
    assert reply["type"] == "error" and reply["code"] == "forbidden"
    assert not Run.objects.filter(replaces=old).exists()


@pytest.mark.timeout(180)
def test_a_regenerate_on_a_thread_socket_on_daphne_streams_the_new_run_after_the_ack(server):
    owner = make_user("owner", *STARTER)
    old = answered(server, "q", "a old", owner=owner, thread="t-live")
    server.script(MODEL, [Reply(delay(0.5), text("a "), text("new"), finish("stop"))])
    env = worker_env(server.base_url)
    web, worker = WebProcess(env), WorkerProcess(env)
    try:
        wait_for(worker.ready, 60, worker.output)
        cookie = session_cookie(owner)
        top = events(old)[-1]["seq"]

        async def scenario() -> list[dict[str, Any]]:
            ws = await Socket.open(web.port, f"/ws/chamvi/threads/t-live/?resume={old.pk}:{top}", cookie)
            ws.send({"type": "regenerate", "run_id": old.pk})
            received = await ws.until("run.end", timeout=60)
            await ws.close()
            return received

        received = async_to_sync(scenario)()
    finally:
        worker.stop()
        web.stop()
    new = Run.objects.get(replaces=old)
    assert new.status == "completed" and new.output == "a new"
    ack = received.index({"type": "ack", "action": "regenerate", "run_id": new.pk, "replaces": old.pk})
    streamed = [e for e in received if "seq" in e and e["run_id"] == new.pk]
    # Every event of the new run, from its start; its answer (held back by the model) after the ack.
    assert [e["seq"] for e in streamed] == list(range(1, len(streamed) + 1))
    assert streamed[0]["type"] == "run.start" and streamed[0]["replaces"] == old.pk
    first_delta = next(n for n, e in enumerate(received) if e.get("type") == "delta")
    assert ack < first_delta
    assert "".join(e["text"] for e in streamed if e["type"] == "delta") == "a new"
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["status"] == "completed"
    assert streamed == events(new)
    assert not [e for e in received if "seq" in e and e["run_id"] == old.pk], "the settled run was sent again"
    assert last_sent(server) == ["q"]
    assert Checkpoint.objects.get(run=new).history(-1) == []
