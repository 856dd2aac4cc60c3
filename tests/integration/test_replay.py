"""Replay after long pauses and behind the cap (SPEC §8): keyed by seq, a buffer that outlives any
wait of an active run, runs rebuilt from their steps with no gap and no duplicate for any client.

Time is moved by deleting the buffer's keys in Redis (what their expiry does), never by sleeping.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection

from chamvi_runs import approve, start_run
from chamvi_runs.models import Run, Step, WaitPoint
from chamvi_runs.routing import websocket_application
from chamvi_runs.streaming import replay
from chamvi_runs.streaming.buffer import event_log
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, delay, finish, text, tool_call
from tests.support.sse_helpers import Stream, body, parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'
REBUILT_WAITING = ["run.start", "step.start", "delta", "step.end", "run.waiting"]
AFTER_APPROVAL = ["run.resume", "tool.call", "tool.result", "step.start", "delta", "step.end", "run.end"]


def url(run: Run) -> str:
    return f"/chamvi/api/runs/{run.pk}/stream/"


def waiting_run(server: Any, owner: Any, *chunks: str) -> tuple[Run, WaitPoint]:
    """A run waiting for approval of a refund, after a model call that streamed ``chunks``."""
    streamed = [e for chunk in chunks or ("Refunding",) for e in (text(chunk), delay(0.05))]
    server.script("m-approving", [Reply(*streamed, tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund", created_by=owner))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


def approve_and_finish(server: Any, waitpoint: WaitPoint, user: Any) -> Run:
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    approve(waitpoint.approval_id, by=user)
    try:
        return execute(waitpoint.run_id)
    finally:
        connection.close()  # when called from a worker thread


def expire_buffer(redis: Any, run: Run) -> None:
    """What the buffer's expiry does: its events go, the seq counter stays."""
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:region:{run.pk}")


def assert_consecutive(stream: list[dict[str, Any]], first: int) -> None:
    assert [e["seq"] for e in stream] == list(range(first, first + len(stream)))


def test_after_a_pause_longer_than_the_buffer_a_client_resumes_by_seq(server, root_client, redis):
    run, waitpoint = waiting_run(server, root_client.user)
    seen = events(run)[-1]["seq"]  # the client saw the approval request, then the page slept
    expire_buffer(redis, run)
    approve_and_finish(server, waitpoint, root_client.user)
    streamed = parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(seen))))
    assert [e["type"] for e in streamed] == AFTER_APPROVAL
    assert_consecutive(streamed, seen + 1)
    assert streamed == events(run)  # the buffered events themselves, nothing rebuilt
    assert streamed[-1]["status"] == "completed" and streamed[-1]["output"] == "Refunded."


def test_a_waiting_run_whose_buffer_expired_shows_its_approval_then_streams_on(server, root_client, redis):
    run, waitpoint = waiting_run(server, root_client.user, "I will ", "refund ", "order o-1.")
    top = events(run)[-1]["seq"]
    expire_buffer(redis, run)

    async def scenario():
        stream = Stream(await sync_to_async(root_client.get)(url(run)))
        replayed = await stream.until("run.waiting")
        finish_it = sync_to_async(approve_and_finish, thread_sensitive=False)
        finished = await finish_it(server, waitpoint, root_client.user)
        live = await stream.until("run.end")
        assert await stream.next() is None, "the stream goes on after run.end"
        return replayed, live, finished

    replayed, live, finished = async_to_sync(scenario)()
    assert finished.status == "completed"
    # The client learns that earlier events are gone, then gets the run rebuilt from its steps...
    assert replayed[0]["type"] == "replay.truncated" and replayed[0]["status"] == "waiting"
    assert [e["type"] for e in replayed[1:]] == REBUILT_WAITING
    assert replayed[3]["text"] == Step.objects.get(run=run, kind="llm", index=0).output["text"]
    assert replayed[-1]["approval_id"] == waitpoint.approval_id and replayed[-1]["tool_name"] == "refund"
    # ...then the live events, with no gap and no duplicate.
    assert [e["type"] for e in live] == AFTER_APPROVAL
    assert_consecutive(replayed + live, top + 1)


def test_the_chat_page_socket_of_a_waiting_run_whose_buffer_expired_gets_the_approval(
    server, root_client, redis
):
    run, waitpoint = waiting_run(server, root_client.user)
    expire_buffer(redis, run)
    cookie = f"sessionid={root_client.cookies['sessionid'].value}".encode()
    headers = [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), (b"cookie", cookie)]

    async def scenario():
        comm = WebsocketCommunicator(websocket_application(), f"/ws/chamvi/runs/{run.pk}/?after=0", headers)
        assert (await comm.connect())[0]
        received = []
        while not received or received[-1]["type"] != "run.waiting":
            received.append(await comm.receive_json_from(timeout=10))
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert received[-1]["approval_id"] == waitpoint.approval_id


def test_a_reconnect_after_a_settled_runs_buffer_expired_gets_run_end(server, root_client, redis):
    run, waitpoint = waiting_run(server, root_client.user)
    run = approve_and_finish(server, waitpoint, root_client.user)
    top = events(run)[-1]["seq"]
    expire_buffer(redis, run)
    # The client lost its connection just before run.end, and came back after the buffer expired.
    streamed = parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(top - 1))))
    assert streamed[0]["type"] == "replay.truncated"
    assert_consecutive(streamed, top + 1)
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["status"] == "completed"
    tools = [e for e in streamed if e["type"] == "tool.result"]
    assert len(tools) == 1 and tools[0]["output"]["refunded"] == 500
    # Resuming inside the rebuild goes on where it stopped; after its run.end there is nothing.
    middle = streamed[3]["seq"]
    assert parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(middle)))) == streamed[4:]
    assert parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(streamed[-1]["seq"])))) == []


def lose_seqs(redis: Any, run: Run) -> None:
    """What a Redis that lost its data does to a run: its buffer and its seq counter are gone."""
    redis.delete(f"chamvi:seq:{run.pk}", f"chamvi:events:{run.pk}", f"chamvi:region:{run.pk}")


def test_a_client_that_resumes_after_redis_lost_the_seqs_of_a_settled_run_gets_run_end(
    server, root_client, redis
):
    run, waitpoint = waiting_run(server, root_client.user)
    run = approve_and_finish(server, waitpoint, root_client.user)
    top = events(run)[-1]["seq"]
    lose_seqs(redis, run)
    # The page was sent everything but run.end; the server knows no seq of the run any more: a
    # restart, the run rebuilt from 1 behind a marker at 0, which the page takes below its seq.
    streamed = parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(top - 1))))
    assert streamed[0]["type"] == "replay.truncated" and streamed[0]["seq"] == 0
    assert_consecutive(streamed, 0)
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["output"] == "Refunded."
    assert redis.get(f"chamvi:seq:{run.pk}") is None, "a settled run's rebuild is stored nowhere"


def test_a_page_that_resumes_a_waiting_run_after_redis_lost_its_seqs_streams_on_to_the_end(
    server, root_client, redis
):
    run, waitpoint = waiting_run(server, root_client.user, "I will ", "refund.")
    seen = events(run)[-1]["seq"]  # the page showed the approval request
    lose_seqs(redis, run)

    async def scenario():
        stream = Stream(await sync_to_async(root_client.get)(url(run), HTTP_LAST_EVENT_ID=str(seen)))
        replayed = await stream.until("run.waiting")
        finish_it = sync_to_async(approve_and_finish, thread_sensitive=False)
        finished = await finish_it(server, waitpoint, root_client.user)
        return replayed, await stream.until("run.end"), finished

    replayed, live, finished = async_to_sync(scenario)()
    assert finished.status == "completed"
    # A restart: the run rebuilt and stored from seq 1, behind a marker at 0 (stored nowhere) that
    # the page takes although it is below its seq.
    assert replayed[0]["type"] == "replay.truncated" and replayed[0]["seq"] == 0
    assert [e["type"] for e in replayed[1:]] == REBUILT_WAITING
    # The approval's live events follow the rebuild with no gap.
    assert [e["type"] for e in live] == AFTER_APPROVAL
    assert_consecutive(replayed + live, 0)
    assert events(run) == replayed[1:] + live


def test_an_active_runs_buffer_outlives_its_wait_and_shrinks_after_run_end(
    server, root_client, redis, settings
):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "STREAM_BUFFER_SECONDS": 120}
    run, waitpoint = waiting_run(server, root_client.user)
    # The site's approval TTL (a day by default) or the wait point's own expiry, plus the buffer time.
    assert redis.ttl(f"chamvi:events:{run.pk}") > 24 * 3600
    approve_and_finish(server, waitpoint, root_client.user)
    assert 0 < redis.ttl(f"chamvi:events:{run.pk}") <= 120
    assert redis.ttl(f"chamvi:seq:{run.pk}") > 30 * 24 * 3600


def test_a_runs_buffer_is_capped_and_a_client_behind_the_cap_gets_the_run_rebuilt(
    server, root_client, redis, monkeypatch
):
    monkeypatch.setattr(event_log(), "max_events", 12)
    calls = [
        Reply(tool_call(f"c{n}", "add", f'{{"a": {n}, "b": 1}}'), finish("tool_calls")) for n in range(5)
    ]
    server.script("m-basic", [*calls, Reply(text("Done"), finish("stop"))])
    run = execute(start_run("basic", "add", created_by=root_client.user))
    assert run.status == "completed"
    held = events(run)
    top = held[-1]["seq"]
    assert len(held) == 12 and top > 12 and redis.zcard(f"chamvi:events:{run.pk}") == 12
    # Within the cap: exactly the events after the seq.
    assert parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(top - 5)))) == held[-5:]
    # Behind it: told so, then the whole run rebuilt from its steps.
    streamed = parse(body(root_client.get(url(run))))
    assert streamed[0]["type"] == "replay.truncated" and streamed[0]["from_step"] == 0
    assert_consecutive(streamed, top + 1)
    assert [e["output"] for e in streamed if e["type"] == "tool.result"] == [n + 1 for n in range(5)]
    assert [e["text"] for e in streamed if e["type"] == "delta"] == ["Done"]
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["output"] == "Done"


def test_an_active_run_rebuilt_behind_the_cap_goes_on_without_gap_for_every_client(
    server, root_client, redis, monkeypatch
):
    monkeypatch.setattr(event_log(), "max_events", 8)
    run, waitpoint = waiting_run(server, root_client.user, *(f"w{n} " for n in range(12)))
    top = events(run)[-1]["seq"]
    assert top > 12, "the deltas were not recorded one by one"

    async def read_until_waiting(after: int) -> list[dict[str, Any]]:
        stream = Stream(await sync_to_async(root_client.get)(url(run), HTTP_LAST_EVENT_ID=str(after)))
        got = await stream.until("run.waiting")
        await stream.close()
        return got

    # A client from the start is behind the cap: the run is rebuilt and stored after the counter.
    behind = async_to_sync(read_until_waiting)(0)
    assert behind[0]["type"] == "replay.truncated"
    assert [e["type"] for e in behind[1:]] == REBUILT_WAITING
    assert behind[3]["text"] == "".join(f"w{n} " for n in range(12))
    assert_consecutive(behind, top + 1)
    # A client that was up to date reads the same region; so does the next one behind.
    assert async_to_sync(read_until_waiting)(top) == behind
    assert async_to_sync(read_until_waiting)(3) == behind
    # Live events go on right after the region, for every client.
    approve_and_finish(server, waitpoint, root_client.user)
    streamed = parse(body(root_client.get(url(run), HTTP_LAST_EVENT_ID=str(behind[-1]["seq"]))))
    assert [e["type"] for e in streamed] == AFTER_APPROVAL
    assert_consecutive(streamed, behind[-1]["seq"] + 1)


def test_a_rebuild_carries_the_latest_steps_that_fit_in_its_bytes(server, root_client, monkeypatch):
    monkeypatch.setattr(replay, "REBUILD_BYTES", 6000)
    # Four model calls of 2,000 characters each, a tool call after each of the first three.
    answers = [str(n) * 2000 for n in range(4)]
    calls = [
        Reply(text(a), tool_call(f"c{n}", "add", '{"a": 1, "b": 2}'), finish("tool_calls"))
        for n, a in enumerate(answers[:3])
    ]
    server.script("m-basic", [*calls, Reply(text(answers[3]), finish("stop"))])
    run = execute(start_run("basic", "add", created_by=root_client.user))
    assert run.status == "completed"
    rebuilt = replay.events_from_steps(run)
    # Steps 0..6: the latest two model calls and the tool call between them fit, not a third.
    marker = rebuilt[0]
    assert marker["type"] == "replay.truncated" and marker["from_step"] == 4
    stepped = [e for e in rebuilt if "step" in e]
    assert stepped[0]["type"] == "step.start" and stepped[0]["step"] == 4
    assert sum(len(json.dumps(e)) for e in stepped) <= 6000
    assert [e["text"] for e in rebuilt if e["type"] == "delta"] == answers[2:]
    assert rebuilt[-1]["type"] == "run.end" and rebuilt[-1]["output"] == answers[3]
    # However little fits, the latest model call and what follows it are carried.
    monkeypatch.setattr(replay, "REBUILD_BYTES", 10)
    assert [e["text"] for e in replay.events_from_steps(run) if e["type"] == "delta"] == answers[3:]
