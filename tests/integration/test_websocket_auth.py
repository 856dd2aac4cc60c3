"""A websocket outlives what let it in (issue 18): its user deactivated, their permission removed,
their password changed, their session logged out or expired while it is open. Every command is
decided for the user as the database says now, and a socket whose session ended is closed, at its
next command or at its own check every SESSION_SECONDS. Real sessions, in PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.utils import timezone

from chamvi_runs import start_run
from chamvi_runs.models import RunInput, WaitPoint
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster
from chamvi_runs.web import consumers
from tests.integration.test_websocket import HOST, refused_and_closed, run_path, socket, waiting_run
from tests.support.helpers import logged_in, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def approver() -> Any:
    """A colleague who may view every run and decide approvals; not the run's creator."""
    return make_user("approver", "chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")


def session_headers(client: Any) -> list[tuple[bytes, bytes]]:
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return [HOST, (b"origin", b"http://127.0.0.1"), (b"cookie", cookie)]


def deactivate(client: Any) -> None:
    client.user.is_active = False
    client.user.save()


def remove_permissions(client: Any) -> None:
    client.user.user_permissions.clear()


def change_password(client: Any) -> None:
    # Django's own: the session's auth hash no longer matches (what "log out other sessions" does).
    client.user.set_password("a new password")
    client.user.save()


def log_out(client: Any) -> None:
    client.logout()  # django.contrib.auth.logout: the session is flushed


def expire_session(client: Any) -> None:
    key = client.cookies["sessionid"].value
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() - timedelta(seconds=1))


REVOKED = {
    "deactivated": (deactivate, "unauthenticated", 4401),
    "permissions-removed": (remove_permissions, "not_found", 4403),
    "password-changed": (change_password, "unauthenticated", 4401),
    "logged-out": (log_out, "unauthenticated", 4401),
    "session-expired": (expire_session, "unauthenticated", 4401),
}


@pytest.mark.parametrize("revoke", list(REVOKED))
def test_a_revoked_approver_cannot_approve_on_a_socket_opened_before_and_it_is_closed(server, revoke):
    change, code, close = REVOKED[revoke]
    run, waitpoint = waiting_run(server, make_user("owner"))
    client = logged_in(approver())
    headers = session_headers(client)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        while (await comm.receive_json_from(timeout=5))["type"] != "run.waiting":
            pass
        await sync_to_async(change)(client)
        return await refused_and_closed(comm, {"type": "approve", "approval_id": waitpoint.approval_id})

    reply, closed = async_to_sync(scenario)()
    assert reply["type"] == "error" and reply["code"] == code
    assert closed == {"type": "websocket.close", "code": close}
    waitpoint.refresh_from_db()
    assert waitpoint.decision is None and waitpoint.decided_by_id is None


def test_an_approver_who_lost_only_the_approval_permission_is_refused_and_keeps_watching(server):
    run, waitpoint = waiting_run(server, make_user("owner"))
    client = logged_in(approver())
    headers = session_headers(client)

    def lose_approval() -> None:
        client.user.user_permissions.remove(Permission.objects.get(codename="approve_waitpoint"))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        while (await comm.receive_json_from(timeout=5))["type"] != "run.waiting":
            pass
        # The socket's check of the run needed the permissions: they are cached on its user object.
        await sync_to_async(lose_approval)()
        await comm.send_json_to({"type": "approve", "approval_id": waitpoint.approval_id})
        refused = await comm.receive_json_from(timeout=5)
        # Still open, and still following the run: it may view it.
        await comm.send_json_to({"type": "ping"})
        ping = await comm.receive_json_from(timeout=5)
        await sync_to_async(ChannelsBroadcaster(None).publish)(run.pk, {"type": "probe"})
        probe = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return refused, ping, probe

    refused, ping, probe = async_to_sync(scenario)()
    assert refused["type"] == "error" and refused["code"] == "forbidden"
    assert ping["code"] == "invalid_message" and probe["type"] == "probe"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


def test_a_steerer_logged_out_cannot_send_input_on_an_open_socket():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    client = logged_in(owner)
    headers = session_headers(client)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "input", "payload": "before"})
        ack = await comm.receive_json_from(timeout=5)
        await sync_to_async(log_out)(client)
        await comm.send_json_to({"type": "input", "payload": "after"})
        reply = await comm.receive_json_from(timeout=5)
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return ack, reply, closed

    ack, reply, closed = async_to_sync(scenario)()
    assert ack["type"] == "ack"
    assert reply["code"] == "unauthenticated" and closed["code"] == 4401
    assert [i.payload for i in RunInput.objects.filter(run=run)] == ["before"]


@pytest.mark.parametrize(
    ("revoke", "close"),
    [(log_out, 4401), (deactivate, 4401), (remove_permissions, 4403)],
    ids=["logged-out", "deactivated", "permissions-removed"],
)
def test_a_quiet_socket_whose_session_ended_is_closed_by_its_own_check(
    server, monkeypatch, revoke: Callable[[Any], None], close: int
):
    monkeypatch.setattr(consumers, "SESSION_SECONDS", 0.2)
    run, waitpoint = waiting_run(server, make_user("owner"))
    client = logged_in(approver())
    headers = session_headers(client)

    async def scenario() -> dict[str, Any]:
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        while (await comm.receive_json_from(timeout=5))["type"] != "run.waiting":
            pass
        # Open and in good standing across several checks: nothing comes, nothing closes it.
        assert await comm.receive_nothing(timeout=0.6)
        await sync_to_async(revoke)(client)
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": close}
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


def test_a_thread_socket_of_a_user_logged_out_is_closed_at_its_next_command():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner, thread="t-auth")
    client = logged_in(owner)
    headers = session_headers(client)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        comm = socket("/ws/chamvi/threads/t-auth/", headers)
        assert (await comm.connect())[0]
        await sync_to_async(log_out)(client)
        return await refused_and_closed(comm, {"type": "cancel", "run_id": run.pk})

    reply, closed = async_to_sync(scenario)()
    assert reply["code"] == "unauthenticated" and closed["code"] == 4401
    run.refresh_from_db()
    assert run.status == "queued"


class SignedInBySite:
    """A site's own websocket middleware that signs sockets in without a session (a header it
    trusts, say), in front of the chamvi routes."""

    def __init__(self, user: Any) -> None:
        from channels.routing import URLRouter

        from chamvi_runs.routing import websocket_urlpatterns

        self.user, self.routes = user, URLRouter(websocket_urlpatterns())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        return await self.routes({**scope, "user": self.user}, receive, send)


def test_a_socket_signed_in_by_a_sites_own_middleware_is_checked_against_its_users_row(server):
    run, waitpoint = waiting_run(server, make_user("owner"))
    user = approver()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        comm = WebsocketCommunicator(SignedInBySite(user), run_path(run, after=0), headers=[HOST])
        assert (await comm.connect())[0]
        while (await comm.receive_json_from(timeout=5))["type"] != "run.waiting":
            pass
        await comm.send_json_to({"type": "ping"})
        open_ = await comm.receive_json_from(timeout=5)
        await sync_to_async(deactivate)(SimpleNamespace(user=user))
        await comm.send_json_to({"type": "approve", "approval_id": waitpoint.approval_id})
        reply = await comm.receive_json_from(timeout=5)
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return open_, reply, closed

    open_, reply, closed = async_to_sync(scenario)()
    assert open_["code"] == "invalid_message", "a user in good standing keeps the socket"
    assert reply["code"] == "unauthenticated" and closed["code"] == 4401
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
