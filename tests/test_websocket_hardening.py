"""Websocket hardening (issue 6): thread sockets before the first run, bad input, the cancel
permission, capped thread replays, and events the channel layer loses, repaired from the buffer."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from chamvi_runs import start_run
from chamvi_runs.models import Run, RunInput, WaitPoint
from chamvi_runs.streaming import vocabulary
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster, events_of, message_of, publisher
from chamvi_runs.web import consumers
from tests.helpers import events, make_user
from tests.scripted_server import Reply, delay, finish, text
from tests.test_websocket import (
    assert_gapless,
    command,
    execute_in_thread,
    expect_forbidden,
    headers_for,
    receive_until_end,
    reply_to,
    run_path,
    socket,
    waiting_run,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


# --- thread sockets -------------------------------------------------------------------------------


def test_a_thread_socket_opens_before_the_first_run_and_then_only_to_owner_and_viewers(server):
    owner, onlooker = make_user("owner"), make_user("onlooker")
    viewer = make_user("viewer", "chamvi_runs.view_run")
    server.script("m-basic", [Reply(text("first "), text("answer"), finish("stop"))])
    owners, onlookers, viewers, anonymous = (headers_for(u) for u in (owner, onlooker, viewer, None))
    path = "/ws/chamvi/threads/new-chat/"

    async def scenario():
        await expect_forbidden(socket(path, anonymous))
        mine = socket(path, owners)
        assert (await mine.connect())[0]
        # Any signed-in user may watch a thread nobody owns yet; they see no run they may not view.
        theirs = socket(path, onlookers)
        assert (await theirs.connect())[0]
        assert await mine.receive_nothing(timeout=0.3), "an empty thread has nothing to replay"
        run = await sync_to_async(start_run)("basic", "hi", created_by=owner, thread="new-chat")
        await execute_in_thread(run.pk)
        live = await receive_until_end(mine)
        assert await theirs.receive_nothing(timeout=0.5)
        await mine.disconnect()
        await theirs.disconnect()
        # Now the thread has an owner: the policy decides who else may watch it.
        await expect_forbidden(socket(path, onlookers))
        watching = socket(path, viewers)
        assert (await watching.connect())[0]
        replayed = await receive_until_end(watching)
        await watching.disconnect()
        return run, live, replayed

    run, live, replayed = async_to_sync(scenario)()
    assert live == replayed == events(run)
    assert_gapless(live)
    assert "".join(e["text"] for e in live if e["type"] == "delta") == "first answer"


def test_a_thread_socket_replays_only_the_latest_runs_of_a_long_thread():
    owner = make_user("owner")
    runs = [start_run("basic", f"n{n}", created_by=owner, thread="long") for n in range(60)]
    broadcaster = ChannelsBroadcaster("long")
    for run in runs:
        broadcaster.publish(run.pk, {"type": "probe"})
    broadcaster.flush()
    # Delivered before the socket joins: a send still in flight would reach it live (seen under load).
    assert publisher.flush()
    headers = headers_for(owner)

    async def replay(query: str) -> list[dict[str, Any]]:
        comm = socket(f"/ws/chamvi/threads/long/?{query}", headers)
        assert (await comm.connect())[0]
        replayed = []
        while not await comm.receive_nothing(timeout=0.5):
            replayed.append(await comm.receive_json_from())
        await comm.disconnect()
        return replayed

    replayed = async_to_sync(replay)("after=0")
    assert [e["run_id"] for e in replayed] == [run.pk for run in runs[-50:]]
    # A page that still shows the oldest run names it, and gets it too (first: it is the oldest).
    replayed = async_to_sync(replay)(f"after=0&resume={runs[0].pk}:0")
    assert [e["run_id"] for e in replayed] == [runs[0].pk] + [run.pk for run in runs[-50:]]


# --- bad input ------------------------------------------------------------------------------------


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


# --- cancel needs can_cancel ----------------------------------------------------------------------


def test_cancel_over_the_socket_needs_the_cancel_permission_not_the_steer_one():
    owner = make_user("owner")
    canceller = make_user("canceller", "chamvi_runs.view_run", "chamvi_runs.cancel_run")
    steerer = make_user("steerer", "chamvi_runs.view_run", "chamvi_runs.change_run")
    run = start_run("basic", "go", created_by=owner)
    refused = async_to_sync(command)(run_path(run), headers_for(steerer), {"type": "cancel"})
    assert refused["type"] == "error" and refused["code"] == "forbidden"
    assert Run.objects.get(pk=run.pk).status == "queued"
    # The steerer may still steer: input needs change_run, not cancel_run.
    steered = async_to_sync(command)(run_path(run), headers_for(steerer), {"type": "input", "payload": 1})
    assert steered["type"] == "ack"
    refused = async_to_sync(command)(run_path(run), headers_for(canceller), {"type": "input", "payload": 2})
    assert refused["type"] == "error" and refused["code"] == "forbidden"
    cancelled = async_to_sync(command)(run_path(run), headers_for(canceller), {"type": "cancel"})
    assert cancelled == {"type": "ack", "action": "cancel", "status": "cancelled"}
    assert Run.objects.get(pk=run.pk).status == "cancelled"


# --- events the channel layer loses ---------------------------------------------------------------


async def joined(comm) -> None:
    """Wait until the socket has joined its group and replayed: it answers messages only after."""
    await comm.send_json_to({"type": "ping"})
    assert (await comm.receive_json_from(timeout=5))["code"] == "invalid_message"


class LossyLayer:
    """The real channel layer, but losing the events ``lose`` picks and delivering some twice."""

    def __init__(self, monkeypatch, lose, twice=()) -> None:
        layer = get_channel_layer()
        self.original = layer.group_send
        self.lose, self.twice = lose, twice
        self.lost: list[int] = []
        monkeypatch.setattr(layer, "group_send", self.group_send)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        kept = []
        for event in events_of(message):
            if self.lose(event):
                self.lost.append(event["seq"])
                continue
            kept += [event] * (2 if event.get("seq") in self.twice else 1)
        if kept:
            await self.original(group, message_of(kept))


def test_events_the_layer_loses_are_sent_from_the_buffer_once_each_in_order(
    server, monkeypatch, redis, caplog
):
    owner = make_user("owner")
    server.script(
        "m-basic",
        [
            Reply(
                text("Hel"),
                delay(0.1),
                text("lo "),
                delay(0.1),
                text("the"),
                delay(0.1),
                text("re"),
                finish("stop"),
            )
        ],
    )
    # Lost in the middle (seen as a gap by the next event) and at the end (nothing follows run.end).
    layer = LossyLayer(monkeypatch, lambda e: e.get("seq") in (3, 5) or e.get("type") == "run.end", {2, 4})
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner)
    before = dict(consumers.DROPS)

    async def scenario():
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        await joined(comm)
        await execute_in_thread(run.pk)
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    with caplog.at_level(logging.WARNING, logger="chamvi_runs.web.consumers"):
        received = async_to_sync(scenario)()
    stored = events(run)
    assert received == stored
    assert_gapless(received)
    assert layer.lost[:2] == [3, 5] and received[-1]["type"] == "run.end"
    assert "".join(e["text"] for e in received if e["type"] == "delta") == "Hello there"
    # Every loss is visible: counted in this process and in Redis, and logged.
    counted = {k: consumers.DROPS[k] - before.get(k, 0) for k in ("gap", "late", "unrepaired")}
    assert counted == {"gap": 2, "late": 1, "unrepaired": 0}
    assert redis.hgetall(consumers.DROPS_KEY) == {b"gap": b"2", b"late": b"1"}
    assert sum("did not deliver" in r.getMessage() for r in caplog.records) == 3


def test_a_thread_socket_repairs_losses_without_leaking_runs_it_may_not_view(server, monkeypatch):
    owner, viewer = make_user("owner"), make_user("viewer", "chamvi_runs.view_run")
    server.script("m-basic", [Reply(text("mine"), finish("stop")), Reply(text("theirs"), finish("stop"))])
    mine = start_run("basic", "y", created_by=owner, thread="t-lossy")
    theirs = start_run("basic", "x", created_by=viewer, thread="t-lossy")
    # Every run.end of the thread is lost: only the buffer can end the owner's stream.
    LossyLayer(monkeypatch, lambda e: e.get("type") == "run.end")
    headers = headers_for(owner)

    async def scenario():
        comm = socket("/ws/chamvi/threads/t-lossy/?after=0", headers)
        assert (await comm.connect())[0]
        await joined(comm)
        await execute_in_thread(mine.pk)
        await execute_in_thread(theirs.pk)
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert received == events(mine)
    assert {e["run_id"] for e in received} == {mine.pk}


def test_a_waiting_run_whose_events_after_the_approval_are_lost_still_reaches_its_end(server, monkeypatch):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    server.script("m-approving", [Reply(text("done"), finish("stop"))])
    waited = len(events(run))
    # Everything after the pause is lost, so no gap is ever seen: the quiet check alone repairs it.
    LossyLayer(monkeypatch, lambda e: e.get("seq", 0) > waited)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        replayed = [await comm.receive_json_from(timeout=5) for _ in range(waited)]
        await comm.send_json_to({"type": "approve", "approval_id": waitpoint.approval_id})
        assert (await reply_to(comm))["type"] == "ack"
        await execute_in_thread(run.pk)
        rest = await receive_until_end(comm)
        await comm.disconnect()
        return replayed + [e for e in rest if "seq" in e]

    received = async_to_sync(scenario)()
    assert received == events(run)
    assert received[-1]["type"] == "run.end" and received[-1]["status"] == "completed"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "approved"
