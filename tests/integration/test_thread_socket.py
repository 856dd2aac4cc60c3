"""Thread sockets: one opens before the thread's first run and then only to its owner and viewers,
and a long thread replays only its latest runs."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chamvi_runs import start_run
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster, publisher
from tests.integration.test_websocket import (
    assert_gapless,
    execute_in_thread,
    expect_forbidden,
    headers_for,
    receive_until_end,
    socket,
)
from tests.support.helpers import events, make_user
from tests.support.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


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
