"""Events the channel layer loses are sent from the replay buffer, once each and in order, on run
and thread sockets, also after a wait."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from chamvi_runs import start_run
from chamvi_runs.models import WaitPoint
from chamvi_runs.streaming.broadcast import events_of, message_of
from chamvi_runs.web import consumers
from tests.integration.test_websocket import (
    assert_gapless,
    execute_in_thread,
    headers_for,
    receive_until_end,
    reply_to,
    run_path,
    socket,
    waiting_run,
)
from tests.support.helpers import events, make_user
from tests.support.scripted_server import Reply, delay, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


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
