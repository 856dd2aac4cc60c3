"""The JSON HTTP API (SPEC §7): start, read, cancel, steer and decide runs over HTTP."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import django_rq
import pytest
from django.test import Client
from django.utils import timezone
from django.utils.crypto import get_random_string

from chamvi_runs import start_run, store
from chamvi_runs.models import ApiToken, Run, RunInput, WaitPoint
from chamvi_runs.policy import DefaultPolicy
from chamvi_runs.web.auth import create_token
from tests.support.helpers import Api, anonymous_api, bearer_api, execute, session_api
from tests.support.scripted_server import Reply, error_event, finish, text, tool_call, usage
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

RUNS = "/chamvi/api/runs/"
REFUND_CALL = '{"order_id": "o1", "amount_cents": 5}'


# --- helpers (new_user, admin_user, admin and queue are fixtures of tests/conftest.py) ------------


def queued_runs(queue) -> list[str]:
    """The run id of every job in the queue, in order."""
    return [job.args[0] for job in queue.get_jobs()]


def error_of(response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) >= {"code", "message"} and body["error"]["message"]
    return body["error"]


def waiting_run(server, user: Any = None) -> tuple[Run, WaitPoint]:
    """An ``approving`` run that asked to run ``refund`` and waits for a decision."""
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND_CALL), finish("tool_calls"))])
    run = execute(start_run("approving", {"order": "o1"}, created_by=user))
    assert run.status == "waiting"
    # Its start job was executed in-process above: leave the queue empty for the test.
    django_rq.get_queue("chamvi").empty()
    return run, WaitPoint.objects.get(run=run, decision__isnull=True)


def approval_url(waitpoint: WaitPoint, verb: str) -> str:
    return f"/chamvi/api/approvals/{waitpoint.approval_id}/{verb}/"


# --- starting a run ----------------------------------------------------------------------------


def test_session_start_returns_the_queued_run_and_enqueues_one_job(admin, admin_user, queue):
    response = admin.post(
        RUNS, {"agent": "basic", "payload": {"title": "hi"}, "thread": "t-1", "keys": {"k": 1}}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get()
    assert body["id"] == run.pk
    assert body["status"] == "queued" and run.status == "queued"
    assert body["agent"] == "basic"
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert body["steps"] == [] and body["waiting"] is None and body["inputs"] == []
    assert body["error"] is None and body["output"] is None
    assert body["thread"] == "t-1" and body["created_by"] == admin_user.pk
    assert run.created_by == admin_user
    assert run.trigger["source"] == "http" and run.trigger["trigger"] == "http"
    assert run.trigger["payload"] == {"title": "hi"} and run.trigger["keys"] == {"k": 1}
    assert queued_runs(queue) == [run.pk]


def test_session_post_without_csrf_token_is_refused_and_creates_nothing(admin, queue):
    response = admin.post(RUNS, {"agent": "basic", "payload": "x"}, csrf=False)
    assert response.status_code == 403
    assert error_of(response)["code"] == "csrf_failed"
    admin.headers["X-CSRFToken"] = get_random_string(32)  # a token that matches no cookie
    response = admin.post(RUNS, {"agent": "basic", "payload": "x"})
    assert response.status_code == 403
    assert error_of(response)["code"] == "csrf_failed"
    assert not Run.objects.exists()
    assert queue.count == 0


def test_bearer_token_starts_a_run_without_csrf_and_is_stored_hashed(new_user, queue):
    user = new_user("chamvi_runs.add_run")
    row, raw = create_token(user, "ci")
    stored = ApiToken.objects.get(pk=row.pk)
    assert raw not in (stored.token_hash, stored.prefix)
    assert stored.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert stored.last_used_at is None

    response = bearer_api(raw).post(RUNS, {"agent": "basic", "payload": "from ci"})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.created_by == user
    assert queued_runs(queue) == [run.pk]
    assert ApiToken.objects.get(pk=row.pk).last_used_at is not None
    # The creator reads it back with the same token.
    assert bearer_api(raw).get(f"{RUNS}{run.pk}/").json()["id"] == run.pk


@pytest.mark.parametrize(
    "header",
    ["Bearer chv_not-a-real-token", "Bearer ", "Bearer"],
)
def test_a_wrong_bearer_token_is_401(new_user, queue, header):
    user = new_user("chamvi_runs.add_run")
    create_token(user, "ci")
    response = Api(Client(), {"Authorization": header}).post(RUNS, {"agent": "basic", "payload": 1})
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"
    assert not Run.objects.exists() and queue.count == 0


def test_the_token_of_an_inactive_user_is_401(new_user):
    user = new_user("chamvi_runs.add_run", is_active=False)
    _, raw = create_token(user, "ci")
    response = bearer_api(raw).post(RUNS, {"agent": "basic", "payload": 1})
    assert response.status_code == 401
    assert not Run.objects.exists()


def test_another_authorization_scheme_does_not_hide_the_session(admin, queue):
    """A site behind HTTP basic auth: the browser sends 'Authorization: Basic', the session still counts."""
    admin.headers["Authorization"] = "Basic dXNlcjpwYXNz"
    response = admin.post(RUNS, {"agent": "basic", "payload": 1})
    assert response.status_code == 201, response.content
    assert queued_runs(queue) == [response.json()["id"]]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("{not json", 400, "invalid_json"),
        (b"\xff\xfe", 400, "invalid_json"),
        ('[{"agent": "basic"}]', 400, None),
        ('"basic"', 400, None),
        ("{}", 400, None),
        ('{"payload": 1}', 400, None),
        ('{"agent": 7}', 400, None),
        ('{"agent": "nope", "payload": 1}', 404, "agent_not_found"),
        ('{"agent": "basic", "thread": 5}', 400, None),
        ('{"agent": "basic", "thread": ""}', 400, None),
        ('{"agent": "basic", "concurrency_key": ["a"]}', 400, None),
        ('{"agent": "basic", "keys": ["a"]}', 400, None),
        ('{"agent": "basic", "keys": "a"}', 400, None),
        ('{"agent": "basic", "id": 12}', 400, None),
        ('{"agent": "basic", "id": "' + "x" * 201 + '"}', 400, None),
        ('{"agent": "basic", "payload": 1, "priority": 3}', 400, None),
        ('{"agent": "basic", "payload": NaN}', 400, None),
    ],
)
def test_a_bad_start_request_is_a_json_error_and_creates_nothing(admin, queue, body, status, code):
    response = admin.post(RUNS, raw=body)
    assert response.status_code == status, response.content
    error = error_of(response)
    if code:
        assert error["code"] == code
    assert not Run.objects.exists()
    assert queue.count == 0


def test_a_deeply_nested_body_is_a_400_not_a_crash(admin, queue):
    response = admin.post(RUNS, raw='{"agent": "basic", "payload": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"
    assert not Run.objects.exists() and queue.count == 0


def test_a_form_post_is_refused_as_not_json(admin, queue):
    """A multipart form whose CSRF field was read from the stream: a clear 4xx, not a crash."""
    secret = admin.headers["X-CSRFToken"]
    response = admin.client.post(RUNS, {"csrfmiddlewaretoken": secret, "agent": "basic", "payload": "x"})
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"
    assert not Run.objects.exists() and queue.count == 0


@pytest.mark.parametrize("size", [200, 40 * 1024])
def test_a_payload_over_max_payload_bytes_is_413(admin, queue, settings, size):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MAX_PAYLOAD_BYTES": 100}
    response = admin.post(RUNS, {"agent": "basic", "payload": "x" * size})
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"
    assert not Run.objects.exists() and queue.count == 0
    # Under the cap it is accepted.
    assert admin.post(RUNS, {"agent": "basic", "payload": "x" * 50}).status_code == 201


def test_anonymous_start_is_401(queue):
    response = anonymous_api().post(RUNS, {"agent": "basic", "payload": 1})
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"
    assert response.headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert not Run.objects.exists() and queue.count == 0


def test_a_user_without_add_run_permission_is_403(new_user, queue):
    user = new_user("chamvi_runs.view_run")
    for api in (session_api(user), bearer_api(create_token(user, "ci")[1])):
        response = api.post(RUNS, {"agent": "basic", "payload": 1})
        assert response.status_code == 403
        assert error_of(response)["code"] == "forbidden"
    assert not Run.objects.exists() and queue.count == 0


def test_a_user_with_add_run_permission_may_start(new_user, queue):
    response = session_api(new_user("chamvi_runs.add_run")).post(RUNS, {"agent": "basic", "payload": 1})
    assert response.status_code == 201
    assert queued_runs(queue) == [response.json()["id"]]


def test_a_wrong_method_is_405_json(admin):
    response = admin.get(RUNS)
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"
    assert response.headers["Allow"] == "POST"
    run = start_run("basic", 1)
    response = admin.post(f"{RUNS}{run.pk}/", {})
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET"
    assert admin.get(f"{RUNS}{run.pk}/cancel/").status_code == 405
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_the_same_trigger_id_returns_the_same_run_once(admin, queue):
    request = {"agent": "basic", "payload": {"n": 1}, "id": "evt-42"}
    first = admin.post(RUNS, request)
    second = admin.post(RUNS, {**request, "payload": {"n": 2}})
    assert first.status_code == 201 and second.status_code in (200, 201)
    assert first.json()["id"] == second.json()["id"]
    assert Run.objects.count() == 1
    assert Run.objects.get().trigger["payload"] == {"n": 1}
    assert queued_runs(queue) == [first.json()["id"]]
    # Another agent may use the same envelope id.
    other = admin.post(RUNS, {**request, "agent": "structured"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


class TeamPolicy(DefaultPolicy):
    """A site whose users share one scope of keys and trigger ids."""

    def scope(self, user: Any) -> str:
        return "team"


def test_a_trigger_id_in_a_shared_scope_does_not_reveal_another_users_run(admin, new_user, queue, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "POLICY": "tests.integration.test_http_api.TeamPolicy"}
    first = admin.post(RUNS, {"agent": "basic", "payload": {"secret": "s3"}, "id": "evt-1"})
    assert first.status_code == 201
    response = session_api(new_user("chamvi_runs.add_run")).post(
        RUNS, {"agent": "basic", "payload": 1, "id": "evt-1"}
    )
    assert response.status_code == 409
    assert "s3" not in response.content.decode()
    assert Run.objects.count() == 1
    assert queued_runs(queue) == [first.json()["id"]]


# --- reading a run -----------------------------------------------------------------------------


def test_the_creator_sees_the_run_others_need_view_permission(new_user):
    creator = new_user("chamvi_runs.add_run")
    run_id = session_api(creator).post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    url = f"{RUNS}{run_id}/"

    mine = session_api(creator).get(url)
    assert mine.status_code == 200 and mine.json()["id"] == run_id

    stranger = session_api(new_user("chamvi_runs.add_run")).get(url)
    assert stranger.status_code == 404
    assert error_of(stranger)["code"] == "not_found"

    viewer = session_api(new_user("chamvi_runs.view_run")).get(url)
    assert viewer.status_code == 200 and viewer.json()["id"] == run_id

    anonymous = anonymous_api().get(url)
    assert anonymous.status_code == 401

    missing = session_api(creator).get(f"{RUNS}run_doesnotexist/")
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "not_found"


def test_get_after_execution_shows_status_output_usage_and_steps(admin, server):
    server.script("m-basic", [Reply(text("hi"), finish("stop"), usage(1, 1))])
    run_id = admin.post(RUNS, {"agent": "basic", "payload": "hello"}).json()["id"]
    execute(run_id)
    response = admin.get(f"{RUNS}{run_id}/")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "completed"
    assert body["output"] == "hi"
    assert body["error"] is None
    assert body["usage"] == {"input_tokens": 1, "output_tokens": 1}
    assert body["started_at"] and body["finished_at"]
    assert body["claim_owner"] is None
    assert body["waiting"] is None
    [step] = body["steps"]
    assert (step["index"], step["kind"], step["name"]) == (0, "llm", "m-basic")
    assert step["output"]["text"] == "hi"


def test_a_failed_run_shows_its_error_code_and_message(admin, server):
    server.script("m-basic", [Reply(text("par"), error_event("model exploded"))])
    run_id = admin.post(RUNS, {"agent": "basic", "payload": "hello"}).json()["id"]
    execute(run_id)
    body = admin.get(f"{RUNS}{run_id}/").json()
    assert body["status"] == "failed"
    assert body["error"]["code"] == "model_error"
    assert "model exploded" in body["error"]["message"]


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_a_queued_run(admin):
    run_id = admin.post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    response = admin.post(f"{RUNS}{run_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.finished_at is not None
    assert admin.get(f"{RUNS}{run_id}/").json()["status"] == "cancelled"


def test_cancel_needs_the_cancel_permission(new_user):
    creator = new_user("chamvi_runs.add_run")
    run_id = session_api(creator).post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    url = f"{RUNS}{run_id}/cancel/"

    assert session_api(new_user()).post(url).status_code == 404  # may not even see it
    viewer = session_api(new_user("chamvi_runs.view_run")).post(url)
    assert viewer.status_code == 403 and error_of(viewer)["code"] == "forbidden"
    assert anonymous_api().post(url).status_code == 401
    assert session_api(creator).post(url, csrf=False).status_code == 403  # CSRF
    assert Run.objects.get(pk=run_id).status == "queued"

    changer = session_api(new_user("chamvi_runs.view_run", "chamvi_runs.change_run")).post(url)
    assert changer.status_code == 403
    assert Run.objects.get(pk=run_id).status == "queued"

    canceller = session_api(new_user("chamvi_runs.view_run", "chamvi_runs.cancel_run")).post(url)
    assert canceller.status_code == 200
    assert Run.objects.get(pk=run_id).status == "cancelled"


def test_cancel_a_waiting_run_closes_its_approval(admin, admin_user, server):
    run, waitpoint = waiting_run(server, admin_user)
    response = admin.post(f"{RUNS}{run.pk}/cancel/")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "cancelled" and body["waiting"] is None
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is not None
    assert admin.post(approval_url(waitpoint, "approve")).status_code in (409, 410)


# --- steering input ----------------------------------------------------------------------------


def test_input_on_a_queued_run_is_accepted_and_shown_in_the_receipt(admin, server):
    run_id = admin.post(RUNS, {"agent": "basic", "payload": "hello"}).json()["id"]
    response = admin.post(f"{RUNS}{run_id}/input/", {"payload": {"note": "be brief"}})
    assert response.status_code == 202
    input_id = response.json()["id"]
    assert RunInput.objects.get(pk=input_id).payload == {"note": "be brief"}
    assert RunInput.objects.get(pk=input_id).run_id == run_id
    assert admin.get(f"{RUNS}{run_id}/").json()["inputs"] == []  # not taken into account yet

    server.script("m-basic", [Reply(text("ok"), finish("stop"))])
    execute(run_id)
    assert admin.get(f"{RUNS}{run_id}/").json()["inputs"] == [input_id]
    messages = server.requests_for("m-basic")[0]["messages"]
    assert any("be brief" in json.dumps(m) for m in messages if m["role"] == "user")


@pytest.mark.parametrize(
    ("body", "status"),
    [({}, 400), ({"text": "x"}, 400), ("[1]", 400), ("{nope", 400), ({"payload": "x" * 500}, 413)],
)
def test_bad_input_is_rejected(admin, settings, body, status):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MAX_PAYLOAD_BYTES": 100}
    run_id = admin.post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    url = f"{RUNS}{run_id}/input/"
    response = admin.post(url, raw=body) if isinstance(body, str) else admin.post(url, body)
    assert response.status_code == status
    error_of(response)
    assert not RunInput.objects.exists()


def test_input_on_a_completed_run_is_409(admin, server):
    server.script("m-basic", [Reply(text("done"), finish("stop"))])
    run_id = admin.post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    assert execute(run_id).status == "completed"
    response = admin.post(f"{RUNS}{run_id}/input/", {"payload": "late"})
    assert response.status_code == 409
    error_of(response)
    assert not RunInput.objects.exists()


def test_input_needs_steering_rights(new_user):
    creator = new_user("chamvi_runs.add_run")
    run_id = session_api(creator).post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    url = f"{RUNS}{run_id}/input/"
    assert session_api(new_user()).post(url, {"payload": 1}).status_code == 404
    assert session_api(new_user("chamvi_runs.view_run")).post(url, {"payload": 1}).status_code == 403
    assert not RunInput.objects.exists()


# --- approvals ---------------------------------------------------------------------------------


def test_a_waiting_run_shows_its_open_wait_point_without_the_token(admin, admin_user, server):
    run, waitpoint = waiting_run(server, admin_user)
    response = admin.get(f"{RUNS}{run.pk}/")
    body = response.json()
    assert body["status"] == "waiting"
    waiting = body["waiting"]
    assert waiting["approval_id"] == waitpoint.approval_id
    assert waiting["tool_name"] == "refund"
    assert waiting["input"] == {"order_id": "o1", "amount_cents": 5}
    assert waiting["expires_at"] and waiting["decision"] is None
    assert waitpoint.token_hash not in response.content.decode()
    assert "token" not in json.dumps(waiting)


def test_approve_needs_the_permission_then_requeues_the_run_once(new_user, server, queue):
    run, waitpoint = waiting_run(server)
    url = approval_url(waitpoint, "approve")

    anonymous = anonymous_api().post(url)
    assert anonymous.status_code == 401
    lacking = session_api(new_user("chamvi_runs.view_run", "chamvi_runs.change_run")).post(url)
    assert lacking.status_code == 403 and error_of(lacking)["code"] == "forbidden"
    approver_user = new_user("chamvi_runs.approve_waitpoint")
    approver = session_api(approver_user)
    assert approver.post(url, {"reason": "ok"}, csrf=False).status_code == 403  # CSRF
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
    assert queue.count == 0

    response = approver.post(url, {"reason": "looks right"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["approval_id"] == waitpoint.approval_id and body["decision"] == "approved"
    assert body["run_id"] == run.pk and body["reason"] == "looks right" and body["decided_at"]
    decided = WaitPoint.objects.get(pk=waitpoint.pk)
    assert decided.decided_by == approver_user and decided.reason == "looks right"
    run.refresh_from_db()
    assert run.status == "running" and run.claim_owner is None
    assert queued_runs(queue) == [run.pk]

    again = approver.post(approval_url(waitpoint, "deny"))
    assert again.status_code == 409
    assert error_of(again)["code"] == "already_decided"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "approved"
    assert queued_runs(queue) == [run.pk]


def test_a_decision_after_expiry_is_410(admin, server, queue):
    run, waitpoint = waiting_run(server)
    WaitPoint.objects.filter(pk=waitpoint.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = admin.post(approval_url(waitpoint, "deny"), {"reason": "too late"})
    assert response.status_code == 410
    assert error_of(response)["code"] == "expired"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
    assert Run.objects.get(pk=run.pk).status == "waiting"
    assert queue.count == 0


def test_an_unknown_approval_is_404(admin):
    response = admin.post("/chamvi/api/approvals/apr_nope/approve/")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_the_wait_point_token_decides_without_a_session(server, queue):
    run, waitpoint = waiting_run(server)
    raw = store.reissue_token(waitpoint)
    url = approval_url(waitpoint, "approve")

    wrong = anonymous_api().post(url, {"token": "not-the-token"})
    assert wrong.status_code == 403
    assert error_of(wrong)["code"] == "bad_token"
    wrong_type = anonymous_api().post(url, {"token": 123})
    assert wrong_type.status_code == 400
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None

    response = anonymous_api().post(url, {"token": raw, "reason": "by mail"})
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == "approved"
    decided = WaitPoint.objects.get(pk=waitpoint.pk)
    assert decided.decided_by is None and decided.reason == "by mail"
    assert Run.objects.get(pk=run.pk).status == "running"
    assert queued_runs(queue) == [run.pk]
    assert anonymous_api().post(url, {"token": raw}).status_code == 409


def test_the_token_in_the_query_string_works_too(server, queue):
    run, waitpoint = waiting_run(server)
    raw = store.reissue_token(waitpoint)
    response = anonymous_api().post(f"{approval_url(waitpoint, 'deny')}?token={raw}")
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == "denied"
    assert Run.objects.get(pk=run.pk).status == "running"
    assert queued_runs(queue) == [run.pk]


def test_a_token_decides_only_its_own_approval(server):
    _, first = waiting_run(server)
    _, second = waiting_run(server)
    raw = store.reissue_token(first)
    response = anonymous_api().post(approval_url(second, "approve"), {"token": raw})
    assert response.status_code == 403
    assert WaitPoint.objects.get(pk=second.pk).decision is None


def test_approved_over_http_the_tool_runs_and_the_run_completes(admin, admin_user, server):
    run, waitpoint = waiting_run(server, admin_user)
    assert not Refund.objects.exists()
    assert admin.post(approval_url(waitpoint, "approve")).status_code == 200

    server.script("m-approving", [Reply(text("Refunded."), finish("stop"), usage(3, 2))])
    execute(run.pk)
    body = admin.get(f"{RUNS}{run.pk}/").json()
    assert body["status"] == "completed" and body["output"] == "Refunded."
    assert body["waiting"] is None
    refund = Refund.objects.get()
    assert (refund.order_id, refund.amount_cents) == ("o1", 5)
    tool_steps = [s for s in body["steps"] if s["kind"] == "tool"]
    assert [s["name"] for s in tool_steps] == ["refund"]
    assert tool_steps[0]["output"]["refunded"] == 5


def test_denied_over_http_the_model_is_told_and_nothing_is_refunded(admin, admin_user, server):
    run, waitpoint = waiting_run(server, admin_user)
    assert admin.post(approval_url(waitpoint, "deny"), {"reason": "no way"}).status_code == 200

    server.script("m-approving", [Reply(text("Not refunded."), finish("stop"))])
    assert execute(run.pk).status == "completed"
    assert not Refund.objects.exists()
    last = server.requests_for("m-approving")[-1]["messages"][-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "c1"
    assert "denied" in last["content"] and "no way" in last["content"]
