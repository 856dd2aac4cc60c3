"""Bad input on a socket: an after or resume that is not what it should be is a clear error and a
4400 close; deep or unstorable messages get an error reply, not a disconnect."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync

from chamvi_runs import start_run
from chamvi_runs.models import RunInput
from chamvi_runs.streaming import vocabulary
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster
from tests.integration.test_websocket import (
    command,
    headers_for,
    run_path,
    socket,
)
from tests.support.helpers import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def refusal(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a socket connecting to ``path`` gets: its first message, and then the close."""

    async def scenario():
        comm = socket(path, headers)
        assert (await comm.connect())[0]
        first = await comm.receive_json_from(timeout=5)
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return first, closed

    return async_to_sync(scenario)()


@pytest.mark.parametrize("after", ["%C2%B2", "%D9%A3", "-1", "1e3", "3.0", "%EF%BC%93"])
def test_an_after_that_is_not_ascii_digits_is_a_clear_error_and_a_4400_close(server, after):
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    ChannelsBroadcaster(None).publish(run.pk, {"type": "probe"})
    ChannelsBroadcaster(None).flush()
    first, closed = refusal(f"/ws/chamvi/runs/{run.pk}/?after={after}", headers_for(owner))
    assert first["type"] == "error" and first["code"] == "invalid_after"
    assert "invalid_after" in dict(vocabulary.ERROR_CODES)  # what the client's declarations know
    assert closed == {"type": "websocket.close", "code": 4400}


@pytest.mark.parametrize(
    "resume",
    [
        "run_x",
        "run_x:",
        ":5",
        "run_x:-1",
        "run_x:%C2%B2",
        "run_x:5,",
        "run_x:5,%00:1",
        ",".join(["r:1"] * 51),
    ],
)
def test_a_thread_socket_refuses_a_resume_that_is_not_run_id_seq_pairs_with_4400(resume):
    owner = make_user("owner")
    start_run("basic", "go", created_by=owner, thread="t-bad")
    first, closed = refusal(f"/ws/chamvi/threads/t-bad/?after=0&resume={resume}", headers_for(owner))
    assert first["type"] == "error" and first["code"] == "invalid_after" and "resume" in first["message"]
    assert closed == {"type": "websocket.close", "code": 4400}


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"type": "input", "payload": ' + "[" * 70 + "]" * 70 + "}",
        '{"type": "approve", "approval_id": "wp\\u0000x"}',
        '{"type": "deny", "approval_id": "' + "x" * 300 + '"}',
        '{"type": "approve", "approval_id": "wp\\ud800x"}',
    ],
    ids=["recursion", "deeper-than-64", "nul-id", "long-id", "lone-surrogate-id"],
)
def test_deep_or_unstorable_messages_get_an_error_reply_not_a_disconnect(raw):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run = start_run("basic", "go", created_by=owner)
    reply = async_to_sync(command)(run_path(run), headers_for(owner), None, raw=raw)
    assert reply["type"] == "error" and reply["code"] == "invalid_message"
    assert not RunInput.objects.exists()


def test_a_lone_surrogate_in_an_input_is_invalid_payload_not_an_internal_error():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    raw = '{"type": "input", "payload": {"note": "a\\ud800b"}}'
    reply = async_to_sync(command)(run_path(run), headers_for(owner), None, raw=raw)
    assert reply["type"] == "error" and reply["code"] == "invalid_payload"
    assert not RunInput.objects.exists()


@pytest.mark.parametrize("thread", ["t-\ud800", "t-\u0000"], ids=["lone-surrogate", "nul"])
def test_a_thread_socket_named_with_unstorable_text_is_refused(thread):
    headers = headers_for(make_user("owner"))

    async def scenario():
        comm = socket(f"/ws/chamvi/threads/{thread}/", headers)
        assert (await comm.connect())[0]
        closed = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 4403}


def test_a_nul_run_id_on_a_thread_socket_is_an_error_reply():
    owner = make_user("owner")
    start_run("basic", "go", created_by=owner, thread="t-nul")
    message = {"type": "cancel", "run_id": "run_\x00"}
    reply = async_to_sync(command)("/ws/chamvi/threads/t-nul/", headers_for(owner), message)
    assert reply["type"] == "error" and reply["code"] == "not_found"
