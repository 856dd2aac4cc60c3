"""The admin is read-only; runs change only through actions, gated by permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from chamvi_runs import start_run
from chamvi_runs.models import ApiToken, Run, WaitPoint
from chamvi_runs.store import hash_token
from tests.helpers import execute
from tests.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _staff(*perms: str) -> Client:
    user = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _waiting(server) -> Run:
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 5}'), finish("tool_calls"))],
    )
    run = execute(start_run("approving", "x"))
    assert run.status == "waiting"
    return run


def test_runs_are_read_only_in_the_admin():
    run = start_run("basic", "x")
    client = _staff("view_run", "change_run")
    page = client.get(f"/admin/chamvi_runs/run/{run.pk}/change/")
    assert page.status_code == 200
    assert b'name="status"' not in page.content, "no editable status field"
    assert client.get("/admin/chamvi_runs/run/add/").status_code == 403


def test_the_cancel_action_cancels_through_the_api():
    run = start_run("basic", "x")
    client = _staff("view_run", "change_run")
    response = client.post(
        "/admin/chamvi_runs/run/", {"action": "cancel_runs", "_selected_action": [run.pk]}, follow=True
    )
    assert response.status_code == 200
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_approve_actions_need_the_approve_permission(server):
    run = _waiting(server)
    viewer = _staff("view_run", "change_run", "view_waitpoint")
    actions = viewer.get("/admin/chamvi_runs/waitpoint/").content.decode()
    assert 'value="approve"' not in actions
    viewer.post("/admin/chamvi_runs/run/", {"action": "approve_open", "_selected_action": [run.pk]})
    assert WaitPoint.objects.get(run=run).decision is None

    approver = Client()
    user = get_user_model().objects.create_user("approver", password="pw", is_staff=True)
    for codename in ("view_waitpoint", "approve_waitpoint"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    approver.force_login(user)
    waitpoint = WaitPoint.objects.get(run=run)
    approver.post("/admin/chamvi_runs/waitpoint/", {"action": "approve", "_selected_action": [waitpoint.pk]})
    waitpoint.refresh_from_db()
    assert waitpoint.decision == "approved" and waitpoint.decided_by == user
    assert Run.objects.get(pk=run.pk).status == "running"
    server.script("m-approving", [Reply(text("done"), finish("stop"))])
    assert execute(run).status == "completed"


def test_an_api_token_created_in_the_admin_is_shown_once_and_stored_hashed():
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/chamvi_runs/apitoken/add/", {"user": admin.pk, "name": "ci"}, follow=True)
    message = next(str(m) for m in response.context["messages"])
    raw = message.rsplit(" ", 1)[-1]
    token = ApiToken.objects.get(name="ci")
    assert raw.startswith("chv_") and token.token_hash == hash_token(raw)
    assert raw not in str(list(ApiToken.objects.values()))
    assert Client().get("/chamvi/api/runs/nope/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 404
