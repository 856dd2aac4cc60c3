"""Many users on one site over HTTP: keys, trigger ids and threads are the caller's own; run viewers
who are not staff see no execution internals; tokens stay out of error reports."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.core import mail
from django.db import DatabaseError
from django.test import Client
from django.utils.log import AdminEmailHandler

from chamvi_runs import start_run, store
from chamvi_runs.core.states import Status
from chamvi_runs.models import ApiToken, Run, Thread, WaitPoint
from chamvi_runs.runtime.lifecycle import announce_settled
from chamvi_runs.web.auth import create_token
from tests.integration.test_http_api import REFUND_CALL, RUNS, approval_url, queued_runs, waiting_run
from tests.support.helpers import bearer, bearer_api, events, execute, logged_in, session_api
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

WORKER = "web-7.internal.example:4242"
CRASH = "OperationalError: password authentication failed for user 'refunds' on db-3.internal.example"


# --- concurrency keys and trigger ids ----------------------------------------------------------


def test_another_users_waiting_run_does_not_hold_my_concurrency_key(new_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND_CALL), finish("tool_calls"))])
    bobs = session_api(bob).post(RUNS, {"agent": "approving", "payload": 1, "concurrency_key": "order-1"})
    assert execute(bobs.json()["id"]).status == "waiting"

    server.script("m-basic", [Reply(text("done"), finish("stop"))])
    alices = session_api(alice).post(RUNS, {"agent": "basic", "payload": 2, "concurrency_key": "order-1"})
    assert alices.status_code == 201 and alices.json()["concurrency_key"] == "order-1"
    assert execute(alices.json()["id"]).status == "completed"
    assert Run.objects.get(pk=bobs.json()["id"]).status == "waiting"

    # Within one user the key still admits one run at a time.
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND_CALL), finish("tool_calls"))])
    first = session_api(alice).post(RUNS, {"agent": "approving", "payload": 3, "concurrency_key": "k2"})
    assert execute(first.json()["id"]).status == "waiting"
    second = session_api(alice).post(RUNS, {"agent": "basic", "payload": 4, "concurrency_key": "k2"})
    assert execute(second.json()["id"]).status == "queued"


def test_a_trigger_id_taken_by_another_user_does_not_return_their_run(new_user, queue):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    bobs = session_api(bob).post(RUNS, {"agent": "basic", "payload": {"from": "bob"}, "id": "evt-9"})
    assert bobs.status_code == 201

    # Alice's webhook sends the id Bob guessed: Alice gets a run of her own, not Bob's.
    alices = bearer_api(create_token(alice, "hook")[1])
    response = alices.post(RUNS, {"agent": "basic", "payload": {"from": "alice"}, "id": "evt-9"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != bobs.json()["id"] and body["created_by"] == alice.pk
    assert body["trigger"]["payload"] == {"from": "alice"}
    # Her webhook's retry still creates nothing new.
    again = alices.post(RUNS, {"agent": "basic", "payload": {"from": "alice"}, "id": "evt-9"})
    assert again.json()["id"] == body["id"]
    assert Run.objects.count() == 2
    assert queued_runs(queue) == [bobs.json()["id"], body["id"]]
    # From Python the id is global, on purpose: a third run, then the same one again.
    from_code = start_run("basic", 1, id="evt-9")
    assert from_code.pk not in (body["id"], bobs.json()["id"])
    assert start_run("basic", 2, id="evt-9").pk == from_code.pk


# --- threads -----------------------------------------------------------------------------------


def test_a_thread_name_another_user_took_first_is_still_mine_over_http(new_user, queue):
    """Names are scoped to the caller (tests/integration/test_thread_scope.py has the conversations)."""
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    first = session_api(alice).post(RUNS, {"agent": "basic", "payload": "secret", "thread": "t-42"})
    assert first.status_code == 201

    for api in (session_api(bob), bearer_api(create_token(bob, "ci")[1])):
        response = api.post(RUNS, {"agent": "basic", "payload": "me too", "thread": "t-42"})
        assert response.status_code == 201, response.content
        assert "secret" not in response.content.decode()
    assert sorted(Thread.objects.values_list("scope", "owner")) == [
        (f"user:{alice.pk}", alice.pk),
        (f"user:{bob.pk}", bob.pk),
    ]


# --- what viewers see --------------------------------------------------------------------------


def _failed_on_an_internal_error(user: Any) -> Run:
    """A run whose execution crashed with exception text that names the site's internals."""
    run = start_run("basic", 1, created_by=user)
    claim = store.claim(run.pk, WORKER, 60)
    assert claim is not None
    assert store.settle(claim, Status.FAILED, error_code="internal_error", error_message=CRASH)
    return Run.objects.get(pk=run.pk)


def test_only_staff_see_the_worker_that_holds_a_run(new_user):
    creator = new_user("chamvi_runs.add_run")
    run = start_run("basic", 1, created_by=creator)
    assert store.claim(run.pk, WORKER, 60) is not None

    mine = session_api(creator).get(f"{RUNS}{run.pk}/")
    assert mine.status_code == 200 and mine.json()["status"] == "running"
    assert "claim_owner" not in mine.json() and "web-7" not in mine.content.decode()
    viewer = session_api(new_user("chamvi_runs.view_run")).get(f"{RUNS}{run.pk}/")
    assert "web-7" not in viewer.content.decode()

    staff = session_api(new_user("chamvi_runs.view_run", is_staff=True)).get(f"{RUNS}{run.pk}/")
    assert staff.json()["claim_owner"] == WORKER


def test_an_internal_error_shows_its_text_to_staff_only(new_user):
    creator = new_user("chamvi_runs.add_run")
    run = _failed_on_an_internal_error(creator)

    error = session_api(creator).get(f"{RUNS}{run.pk}/").json()["error"]
    assert error["code"] == "internal_error" and error["message"]
    assert "db-3" not in error["message"] and "password" not in error["message"]
    client = logged_in(creator)
    page = client.get(f"/chamvi/runs/{run.pk}/").content.decode()
    assert "internal_error" in page and "db-3" not in page and "password" not in page

    staff_user = new_user("chamvi_runs.view_run", is_staff=True)
    assert session_api(staff_user).get(f"{RUNS}{run.pk}/").json()["error"]["message"] == CRASH
    client.force_login(staff_user)
    assert "db-3.internal.example" in client.get(f"/chamvi/runs/{run.pk}/").content.decode()

    # The run.end event reaches every viewer of the run: it carries the public message.
    announce_settled(run.pk)
    [end] = [e for e in events(run) if e["type"] == "run.end"]
    assert end["error"] == error


# --- tokens in error reports -------------------------------------------------------------------


class _Unreachable:
    """A model manager whose database went away: the request crashes with a 500."""

    def __getattr__(self, name: str) -> Any:
        raise DatabaseError("the database is unreachable")


@pytest.fixture
def error_mails(settings) -> Iterator[list[Any]]:
    """Error reports as ``mail_admins`` with ``include_html`` sends them: with each frame's variables."""
    settings.DEBUG = False
    # Django 6 takes plain addresses and deprecates the (name, address) pairs that 5.2 requires; 6.1
    # warns without a MAILERS entry, which 5.2 ignores.
    settings.ADMINS = ["ops@example.com"] if django.VERSION >= (6, 0) else [("Ops", "ops@example.com")]
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    handler = AdminEmailHandler(include_html=True)
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    mail.outbox.clear()
    yield mail.outbox
    logger.removeHandler(handler)


def _report(outbox: list[Any]) -> str:
    # Django's own mail_admins handler sends the text-only report alongside.
    [message] = [m for m in outbox if m.alternatives]
    html = message.alternatives[0][0]
    assert "the database is unreachable" in html and "Local Vars" in html, "a full report"
    return message.body + html


def test_an_approval_token_is_not_in_the_error_report_of_a_crash(server, error_mails, monkeypatch):
    _, waitpoint = waiting_run(server)
    raw = store.reissue_token(waitpoint)
    monkeypatch.setattr(WaitPoint, "objects", _Unreachable())
    client = Client(raise_request_exception=False)
    url = approval_url(waitpoint, "approve")
    response = client.post(url, {"token": raw}, content_type="application/json")
    assert response.status_code == 500
    assert raw not in _report(error_mails)


def test_a_bearer_token_is_not_in_the_error_report_of_a_crash(new_user, error_mails, monkeypatch):
    _, raw = create_token(new_user("chamvi_runs.add_run"), "ci")
    monkeypatch.setattr(ApiToken, "objects", _Unreachable())
    client = Client(raise_request_exception=False)
    response = client.post(RUNS, {"agent": "basic"}, content_type="application/json", headers=bearer(raw))
    assert response.status_code == 500
    assert raw not in _report(error_mails)


# --- the approvals page ------------------------------------------------------------------------


def test_the_approvals_page_cancels_with_the_cancel_permission(new_user, server):
    run, _ = waiting_run(server)
    decider = ("chamvi_runs.approve_waitpoint", "chamvi_runs.view_run")
    changer = logged_in(new_user(*decider, "chamvi_runs.change_run"))
    canceller = logged_in(new_user(*decider, "chamvi_runs.cancel_run"))

    assert 'value="cancel"' not in changer.get("/chamvi/approvals/").content.decode()
    assert changer.post("/chamvi/approvals/", {"action": "cancel", "run_id": run.pk}).status_code == 404
    assert Run.objects.get(pk=run.pk).status == "waiting"

    assert 'value="cancel"' in canceller.get("/chamvi/approvals/").content.decode()
    response = canceller.post("/chamvi/approvals/", {"action": "cancel", "run_id": run.pk})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).status == "cancelled"
