"""Who may open a websocket (issue 18): scripts with an API token, offered as the subprotocol
``chamvi.bearer.<token>`` (never in the URL) and needing no Origin; browsers with the session
cookie, whose Origin must be the site's own as Django's CSRF check wants it, whatever ALLOWED_HOSTS
allows. The token's script of docs/streaming.md runs against a real daphne."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from chamvi_runs.models import ApiToken, WaitPoint
from chamvi_runs.routing import websocket_application
from chamvi_runs.web.auth import create_token
from tests.docsamples import block
from tests.integration.test_websocket import (
    HOST,
    completed_run,
    receive_until_end,
    refused_and_closed,
    run_path,
    waiting_run,
)
from tests.support.helpers import events, make_user, session_cookie
from tests.support.processes import ROOT, WebProcess, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def offering(raw: str, *protocols: str) -> list[str]:
    return [*(protocols or ("chamvi",)), f"chamvi.bearer.{raw}"]


async def handshake(path: str, headers: list[tuple[bytes, bytes]], protocols: list[str] | None = None) -> Any:
    """Connect; the communicator, and what the handshake answered: (accepted, subprotocol)."""
    comm = WebsocketCommunicator(websocket_application(), path, headers=headers, subprotocols=protocols)
    return comm, await comm.connect()


# --- API tokens -----------------------------------------------------------------------------------


def test_a_script_with_an_api_token_and_no_origin_follows_a_run_and_decides(server):
    owner = make_user("owner")
    bot = make_user("bot", "chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    token, raw = create_token(bot, "ops script")

    async def scenario() -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
        # A script sends no Origin and no cookie.
        comm, answered = await handshake(run_path(run, after=0), [HOST], offering(raw))
        replayed = [await comm.receive_json_from(timeout=5) for _ in events(run)]
        await comm.send_json_to({"type": "approve", "approval_id": waitpoint.approval_id, "reason": "bot"})
        reply = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return answered, replayed, reply

    answered, replayed, reply = async_to_sync(scenario)()
    # The server echoes the protocol it speaks, never the token.
    assert answered == (True, "chamvi")
    assert replayed == events(run)
    assert reply == {"type": "ack", "action": "approve", "approval_id": waitpoint.approval_id}
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.decided_by_id, waitpoint.reason) == ("approved", bot.pk, "bot")
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


def test_a_thread_socket_takes_a_token_too(server):
    owner = make_user("owner")
    run = completed_run(server, owner, thread="t-token")
    _, raw = create_token(owner, "script")

    async def scenario() -> list[dict[str, Any]]:
        comm, answered = await handshake("/ws/chamvi/threads/t-token/", [HOST], offering(raw))
        assert answered == (True, "chamvi")
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    assert async_to_sync(scenario)() == events(run)


def test_a_token_socket_ignores_cookies_and_origin(server):
    """A token is not ambient authority: a socket offering one is its user's, whatever cookie a
    browser adds, and needs no Origin check (another site's page cannot know the token)."""
    owner, stranger = make_user("owner"), make_user("stranger")
    run = completed_run(server, owner)
    _, raw = create_token(owner, "script")
    _, strangers = create_token(stranger, "script")
    cookie = (b"cookie", session_cookie(stranger).encode())
    elsewhere = [HOST, (b"origin", b"http://evil.example"), cookie]

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        comm, answered = await handshake(run_path(run, after=0), elsewhere, offering(raw))
        assert answered == (True, "chamvi")
        received = await receive_until_end(comm)
        await comm.disconnect()
        comm, answered = await handshake(run_path(run, after=0), elsewhere, offering(strangers))
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return received, closed

    received, closed = async_to_sync(scenario)()
    assert received == events(run)
    assert closed == {"type": "websocket.close", "code": 4403}


@pytest.mark.parametrize("raw", ["chv_not-a-token", ""], ids=["unknown", "empty"])
def test_a_token_that_does_not_authenticate_is_closed_with_4401(server, raw):
    run = completed_run(server, make_user("owner"))

    async def scenario() -> tuple[Any, dict[str, Any]]:
        comm, answered = await handshake(run_path(run), [HOST], offering(raw))
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return answered, closed

    answered, closed = async_to_sync(scenario)()
    assert answered == (True, "chamvi")
    assert closed["type"] == "websocket.close" and closed["code"] == 4401


def test_a_token_offered_without_the_chamvi_protocol_is_refused_at_the_handshake(server):
    owner = make_user("owner")
    run = completed_run(server, owner)
    _, raw = create_token(owner, "script")

    async def scenario() -> Any:
        # From a page of the site, even: a client that cannot take "chamvi" back would fail anyway.
        page = [HOST, (b"origin", b"http://127.0.0.1")]
        comm, answered = await handshake(run_path(run), page, [f"chamvi.bearer.{raw}"])
        await comm.disconnect()
        return answered

    assert async_to_sync(scenario)()[0] is False


@pytest.mark.parametrize("revoke", ["token-deleted", "user-deactivated"])
def test_a_socket_whose_token_was_revoked_is_refused_its_next_command_and_closed(server, revoke):
    owner = make_user("owner")
    bot = make_user("bot", "chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    token, raw = create_token(bot, "ops script")

    def revoked() -> None:
        if revoke == "token-deleted":
            token.delete()
        else:
            bot.is_active = False
            bot.save()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        comm, _ = await handshake(run_path(run, after=0), [HOST], offering(raw))
        while (await comm.receive_json_from(timeout=5))["type"] != "run.waiting":
            pass
        await sync_to_async(revoked)()
        return await refused_and_closed(comm, {"type": "approve", "approval_id": waitpoint.approval_id})

    reply, closed = async_to_sync(scenario)()
    assert reply["code"] == "unauthenticated" and closed == {"type": "websocket.close", "code": 4401}
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


# --- the Origin of a cookie's socket --------------------------------------------------------------


ORIGINS = {
    # name: (Host, Origin or None, settings, accepted)
    "same-origin": (b"127.0.0.1", b"http://127.0.0.1", {}, True),
    "same-origin-with-port": (b"127.0.0.1:8000", b"http://127.0.0.1:8000", {}, True),
    "https-page-of-the-host": (b"127.0.0.1", b"https://127.0.0.1", {}, True),
    "other-site": (b"127.0.0.1", b"http://evil.example", {}, False),
    "other-site-wildcard-hosts": (b"127.0.0.1", b"http://evil.example", {"ALLOWED_HOSTS": ["*"]}, False),
    "other-port": (b"127.0.0.1:8000", b"http://127.0.0.1:9000", {}, False),
    "other-scheme-host-allowed": (b"127.0.0.1", b"ftp://127.0.0.1", {}, False),
    "no-origin": (b"127.0.0.1", None, {}, False),
    "no-origin-wildcard-hosts": (b"127.0.0.1", None, {"ALLOWED_HOSTS": ["*"]}, False),
    "host-not-allowed": (b"evil.example", b"http://evil.example", {}, False),
    "trusted-origin": (
        b"127.0.0.1",
        b"https://app.example.com",
        {"CSRF_TRUSTED_ORIGINS": ["https://app.example.com"]},
        True,
    ),
    "trusted-subdomain": (
        b"127.0.0.1",
        b"https://eu.app.example.com",
        {"CSRF_TRUSTED_ORIGINS": ["https://*.example.com"]},
        True,
    ),
    "trusted-pattern-other-scheme": (
        b"127.0.0.1",
        b"http://eu.app.example.com",
        {"CSRF_TRUSTED_ORIGINS": ["https://*.example.com"]},
        False,
    ),
    "proxy-https": (
        b"app.example.com",
        b"https://app.example.com",
        {
            "ALLOWED_HOSTS": ["app.example.com"],
            "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
        },
        True,
    ),
    "proxy-https-page-over-http": (
        b"app.example.com",
        b"http://app.example.com",
        {
            "ALLOWED_HOSTS": ["app.example.com"],
            "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
        },
        False,
    ),
}


@pytest.mark.parametrize("case", list(ORIGINS))
def test_a_cookie_socket_needs_an_origin_that_django_csrf_would_take(server, settings, case):
    host, origin, overrides, accepted = ORIGINS[case]
    for name, value in overrides.items():
        setattr(settings, name, value)
    owner = make_user("owner")
    run = completed_run(server, owner)
    headers = [(b"host", host), (b"cookie", session_cookie(owner).encode())]
    if origin is not None:
        headers.append((b"origin", origin))
    if "SECURE_PROXY_SSL_HEADER" in overrides:
        headers.append((b"x-forwarded-proto", b"https"))

    async def scenario() -> tuple[bool, list[dict[str, Any]]]:
        comm, (connected, _) = await handshake(run_path(run, after=0), headers)
        received = await receive_until_end(comm) if connected else []
        await comm.disconnect()
        return connected, received

    connected, received = async_to_sync(scenario)()
    assert connected is accepted
    assert received == (events(run) if accepted else [])


def test_a_page_of_another_site_cannot_approve_with_the_approvers_cookie_under_wildcard_hosts(
    server, settings
):
    settings.ALLOWED_HOSTS = ["*"]
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    headers = [HOST, (b"origin", b"https://attacker.example"), (b"cookie", session_cookie(owner).encode())]

    async def scenario() -> bool:
        comm, (connected, _) = await handshake(run_path(run), headers)
        if connected:
            await comm.send_json_to({"type": "approve", "approval_id": waitpoint.approval_id})
            await comm.receive_nothing(timeout=1)
        await comm.disconnect()
        return connected

    assert async_to_sync(scenario)() is False
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


# --- the docs' script, against daphne -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_docs_token_script_follows_a_run_over_a_real_daphne(server, tmp_path):
    owner = make_user("owner")
    run = completed_run(server, owner)
    _, raw = create_token(owner, "docs script")
    script = tmp_path / "follow.py"
    script.write_text(block("streaming-token-script"))
    web = WebProcess(worker_env(server.base_url))

    def follow(token: str) -> subprocess.CompletedProcess[str]:
        site = {"CHAMVI_SITE": f"http://127.0.0.1:{web.port}", "CHAMVI_TOKEN": token}
        return subprocess.run(
            [sys.executable, str(script), run.pk],
            cwd=ROOT,
            env={**worker_env(server.base_url), **site},
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        done, refused = follow(raw), follow("chv_unknown")
    finally:
        web.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "Hello!\n[completed]\n"
    assert refused.returncode == 1 and refused.stdout == "" and "closed: 4401" in refused.stderr
