"""GET chamvi/api/runs/<id>/stream/: the run's events as Server-Sent Events."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from chamvi_runs import start_run
from chamvi_runs.models import Step
from chamvi_runs.streaming import replay
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster, event_log
from chamvi_runs.web import views_stream
from tests.support.helpers import (
    events,
    execute,
    execute_in_thread,
    execute_losing_run_end,
    logged_in,
    make_user,
)
from tests.support.scripted_server import Reply, delay, finish, text, tool_call
from tests.support.sse_helpers import Stream
from tests.support.sse_helpers import body as _body
from tests.support.sse_helpers import parse as _parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def test_stream_of_a_finished_run_replays_every_event_once(server, root_client):
    server.script("m-basic", [Reply(text("Hel"), text("lo"), finish("stop"))])
    run = execute(start_run("basic", "x", created_by=root_client.user))
    response = root_client.get(f"/chamvi/api/runs/{run.pk}/stream/")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    streamed = _parse(_body(response))
    assert streamed == events(run)
    assert streamed[-1]["type"] == "run.end"


def test_a_stream_of_a_run_whose_end_never_reached_the_buffer_ends_with_it(server, root_client, monkeypatch):
    monkeypatch.setattr(replay, "END_GRACE_SECONDS", 0)
    server.script("m-basic", [Reply(text("Hel"), text("lo"), finish("stop"))])
    run = execute_losing_run_end(start_run("basic", "x", created_by=root_client.user))
    held = events(run)
    assert run.status == "completed" and held[-1]["type"] != "run.end"
    # The stream waits its grace for the end in flight, then stores it, sends it and ends: an
    # EventSource would otherwise reconnect to the same silence for good.
    streamed = _parse(_body(root_client.get(f"/chamvi/api/runs/{run.pk}/stream/?after=1")))
    assert [e["seq"] for e in streamed] == list(range(2, len(held) + 2))
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["output"] == "Hello"
    assert events(run) == [*held, streamed[-1]]


def test_stream_resumes_after_a_seq(server, root_client):
    server.script("m-basic", [Reply(text("a"), text("b"), finish("stop"))])
    run = execute(start_run("basic", "x", created_by=root_client.user))
    streamed = _parse(_body(root_client.get(f"/chamvi/api/runs/{run.pk}/stream/?after=3")))
    assert [e["seq"] for e in streamed] == [e["seq"] for e in events(run) if e["seq"] > 3]
    header = _parse(_body(root_client.get(f"/chamvi/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID="4")))
    assert header[0]["seq"] == 5


def test_an_old_run_is_served_from_its_stored_steps(server, root_client, redis):
    server.script(
        "m-basic",
        [
            Reply(text("Adding"), tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls")),
            Reply(text("3"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x", created_by=root_client.user))
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:seq:{run.pk}")
    streamed = _parse(_body(root_client.get(f"/chamvi/api/runs/{run.pk}/stream/")))
    assert [e["seq"] for e in streamed] == list(range(1, len(streamed) + 1))
    texts = [e["text"] for e in streamed if e["type"] == "delta" and e["kind"] == "text"]
    assert texts == [s.output["text"] for s in Step.objects.filter(run=run, kind="llm")]
    assert next(e for e in streamed if e["type"] == "tool.result")["output"] == 3
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["output"] == "3"


def test_stream_is_only_for_users_who_may_view_the_run(root_client):
    run = start_run("basic", "x", created_by=root_client.user)
    stranger = logged_in(make_user("eve"))
    assert stranger.get(f"/chamvi/api/runs/{run.pk}/stream/").status_code == 404
    assert Client().get(f"/chamvi/api/runs/{run.pk}/stream/").status_code == 401
    assert root_client.get(f"/chamvi/api/runs/{run.pk}/stream/?after=x").status_code == 400


@pytest.mark.parametrize(
    ("after", "last_event_id"),
    [("²", None), ("٣", None), ("-1", None), ("1e3", None), (" 4", None), (None, "²"), (None, "abc")],
)
def test_a_seq_that_is_not_ascii_digits_is_a_json_400(root_client, after, last_event_id):
    run = start_run("basic", "x", created_by=root_client.user)
    headers = {"HTTP_LAST_EVENT_ID": last_event_id} if last_event_id else {}
    response = root_client.get(
        f"/chamvi/api/runs/{run.pk}/stream/", {"after": after} if after else {}, **headers
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_field"


def test_a_stream_follows_a_run_live_until_run_end(server, root_client):
    server.script("m-basic", [Reply(text("Hel"), delay(0.3), text("lo"), finish("stop"))])
    run = start_run("basic", "x", created_by=root_client.user)

    async def scenario():
        stream = Stream(await sync_to_async(root_client.get)(f"/chamvi/api/runs/{run.pk}/stream/"))
        execution = asyncio.ensure_future(execute_in_thread(run.pk))
        first = await stream.next()
        assert not execution.done(), "the first event came live, while the model was answering"
        rest = await stream.until("run.end")
        assert await stream.next() is None
        await execution
        return [first, *rest]

    assert async_to_sync(scenario)() == events(run)


def test_a_stream_sends_what_the_channel_layer_lost_from_the_buffer(root_client):
    run = start_run("basic", "x", created_by=root_client.user)
    log = event_log()

    async def scenario():
        stream = Stream(await sync_to_async(root_client.get)(f"/chamvi/api/runs/{run.pk}/stream/"))
        # Recorded but never delivered by the layer, then a live one: the gap is filled first.
        lost = await sync_to_async(log.append_many)([(run.pk, {"type": "probe", "run_id": run.pk, "n": 1})])
        broadcaster = ChannelsBroadcaster(None)
        await sync_to_async(broadcaster.publish)(run.pk, {"type": "probe", "n": 2})
        await sync_to_async(broadcaster.flush)()
        got = [await stream.next(), await stream.next()]
        # A lost last event (nothing live follows it) is found when the stream is quiet.
        end = {"type": "run.end", "run_id": run.pk, "status": "cancelled"}
        lost += await sync_to_async(log.append_many)([(run.pk, end)])
        got.append(await stream.next())
        assert await stream.next() is None
        return got, lost

    got, lost = async_to_sync(scenario)()
    assert [e["seq"] for e in got] == [1, 2, 3]
    assert got[0] == lost[0] and got[2] == lost[1] and got[1]["n"] == 2


def test_a_quiet_stream_sends_keepalives(root_client, monkeypatch):
    monkeypatch.setattr(views_stream, "KEEPALIVE_SECONDS", 0.2)
    run = start_run("basic", "x", created_by=root_client.user)

    async def scenario():
        response = await sync_to_async(root_client.get)(f"/chamvi/api/runs/{run.pk}/stream/")
        chunks = response.streaming_content.__aiter__()
        got = [await asyncio.wait_for(chunks.__anext__(), 5) for _ in range(3)]
        await chunks.aclose()
        return got

    assert async_to_sync(scenario)()[1:] == [b": keepalive\n\n"] * 2
