"""A client's seq never moves a run's counter (issue 18): a seq ahead of what the server sent, made
up by a viewer or left from before Redis lost its data, gets a restart (``replay.truncated`` at or
below it, then the run from its start) over the run socket, the thread socket and Server-Sent
Events; every other client goes on by the seqs the server numbers, to the run's end, also after the
buffer expired.

Time is moved by deleting the buffer's keys (what their expiry does), never by sleeping.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection

from chamvi_runs import approve, start_run
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.streaming import buffer, cursor, replay
from chamvi_runs.streaming.buffer import MemoryEventLog
from chamvi_runs.web import consumers
from tests.integration.test_websocket import headers_for, run_path, socket
from tests.support.helpers import events, execute, logged_in, make_user
from tests.support.scripted_server import Reply, delay, finish, text, tool_call
from tests.support.sse_helpers import Stream, body, parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

AHEAD = 999_999_999_999
REFUND = '{"order_id": "o-1", "amount_cents": 500}'
REBUILT_WAITING = ["run.start", "step.start", "delta", "step.end", "run.waiting"]
AFTER_APPROVAL = ["run.resume", "tool.call", "tool.result", "step.start", "delta", "step.end", "run.end"]
THREAD = "t-ahead"


def waiting_run(server: Any, owner: Any, chunks: int = 3) -> tuple[Run, WaitPoint]:
    streamed = [e for n in range(chunks) for e in (text(f"w{n} "), delay(0.03))]
    server.script("m-approving", [Reply(*streamed, tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund", created_by=owner, thread=THREAD))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


def finish_it(server: Any, waitpoint: WaitPoint, user: Any) -> Run:
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    approve(waitpoint.approval_id, by=user)
    return execute(waitpoint.run_id)


def _finish_closing(server: Any, waitpoint: WaitPoint, user: Any) -> Run:
    try:
        return finish_it(server, waitpoint, user)
    finally:
        connection.close()  # the worker thread's: the test's teardown would find it open


finish_in_thread = sync_to_async(_finish_closing, thread_sensitive=False)


def counter(redis: Any, run: Run) -> int:
    return int(redis.get(f"chamvi:seq:{run.pk}") or 0)


def expire_buffer(redis: Any, run: Run) -> None:
    """What the buffer's expiry does: its events go, the seq counter stays."""
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:region:{run.pk}", f"chamvi:bytes:{run.pk}")


async def until(comm: Any, kind: str) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    while not received or received[-1]["type"] != kind:
        received.append(await comm.receive_json_from(timeout=10))
    return received


def followed(seen: int, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a page that had seq ``seen`` shows of ``received`` by client.js's rules: each seq once,
    in order, and a replay.truncated whatever its seq (it starts over from it). Fails on a gap, and
    on a duplicate, which the server must not send either."""
    last, shown = seen, []
    for event in received:
        if event["type"] == "replay.truncated":
            last, shown = event["seq"], []
            continue
        assert event["seq"] == last + 1, f"after seq {last} came {event}"
        last = event["seq"]
        shown.append(event)
    return shown


def test_a_viewer_ahead_of_an_active_run_moves_no_counter_and_every_client_sees_the_end(
    server, root_client, redis
):
    viewer = make_user("viewer", "chamvi_runs.view_run")
    run, waitpoint = waiting_run(server, root_client.user)
    held = events(run)
    top = held[-1]["seq"]
    headers, browser = headers_for(viewer), logged_in(viewer)
    paths = {
        "run socket": run_path(run, after=AHEAD),
        "thread socket": f"/ws/chamvi/threads/{THREAD}/?after=0&resume={run.pk}:{AHEAD}",
    }

    async def attack() -> dict[str, list[dict[str, Any]]]:
        got = {}
        for name, path in paths.items():
            comm = socket(path, headers)
            assert (await comm.connect())[0]
            got[name] = await until(comm, "run.waiting")
            await comm.disconnect()
        stream = Stream(
            await sync_to_async(browser.get)(
                f"/chamvi/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID=str(AHEAD)
            )
        )
        got["Server-Sent Events"] = await stream.until("run.waiting")
        await stream.close()
        return got

    for name, received in async_to_sync(attack)().items():
        # A restart: a marker below the viewer's seq, then the run from its first event.
        assert received[0]["type"] == "replay.truncated" and received[0]["seq"] == 0, name
        assert received[1:] == held, name
    # The counter did not move, and the buffer holds what it held.
    assert counter(redis, run) == top
    assert events(run) == held

    # The owner's page, which had every event, follows the run live to its end.
    owners = headers_for(root_client.user)

    async def follow() -> tuple[list[dict[str, Any]], Run]:
        comm = socket(run_path(run, after=top), owners)
        assert (await comm.connect())[0]
        finished = await finish_in_thread(server, waitpoint, root_client.user)
        received = await until(comm, "run.end")
        await comm.disconnect()
        return received, finished

    live, finished = async_to_sync(follow)()
    assert finished.status == "completed"
    assert [e["type"] for e in live] == AFTER_APPROVAL
    assert [e["seq"] for e in live] == list(range(top + 1, top + 1 + len(live)))
    # A page that lost its connection just before run.end comes back after the buffer expired.
    expire_buffer(redis, run)
    resumed = parse(
        body(root_client.get(f"/chamvi/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID=str(live[-2]["seq"])))
    )
    assert resumed[-1]["type"] == "run.end" and resumed[-1]["status"] == "completed"
    assert followed(live[-2]["seq"], resumed)[-1]["output"] == "Refunded."


def test_a_viewer_ahead_of_an_active_run_in_embedded_mode_moves_no_counter(server, root_client, monkeypatch):
    """Embedded mode's buffer (MemoryEventLog) keeps the same rule."""
    run, waitpoint = waiting_run(server, root_client.user)
    log = MemoryEventLog()
    held = log.append_many([(run.pk, {k: v for k, v in e.items() if k != "seq"}) for e in events(run)])
    top = held[-1]["seq"]
    monkeypatch.setattr(replay, "event_log", lambda: log)
    headers = headers_for(root_client.user)
    received = async_to_sync(_until_waiting)(run_path(run, after=AHEAD), headers)
    assert received[0]["type"] == "replay.truncated" and received[0]["seq"] == 0
    assert received[1:] == held
    assert log.window(run.pk, 0).top == top
    # The run goes on in this process: its events are numbered after its own counter.
    finished = finish_it(server, waitpoint, root_client.user)
    later = [e for e in events(finished) if e["seq"] > top]
    live = log.append_many([(run.pk, {k: v for k, v in e.items() if k != "seq"}) for e in later])
    assert [e["seq"] for e in live] == list(range(top + 1, top + 1 + len(live)))
    # A page that lost run.end resumes after the buffer's lifetime passed.
    log.clock = lambda: 10.0**12
    resumed = async_to_sync(_until_end)(run_path(run, after=live[-2]["seq"]), headers)
    assert resumed[-1]["type"] == "run.end" and resumed[-1]["status"] == "completed"
    followed(live[-2]["seq"], resumed)


async def _until_waiting(path: str, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    comm = socket(path, headers)
    assert (await comm.connect())[0]
    received = await until(comm, "run.waiting")
    await comm.disconnect()
    return received


async def _until_end(path: str, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    comm = socket(path, headers)
    assert (await comm.connect())[0]
    received = await until(comm, "run.end")
    await comm.disconnect()
    return received


def test_many_clients_ahead_cost_one_region_and_move_the_counter_once(
    server, root_client, redis, monkeypatch
):
    # Behind the cap, a restart needs the run rebuilt: one region, whoever asks after.
    monkeypatch.setattr(buffer.event_log(), "max_events", 6)
    run, _ = waiting_run(server, root_client.user, chunks=8)
    top = counter(redis, run)
    headers = headers_for(root_client.user)
    first = async_to_sync(_until_waiting)(run_path(run, after=AHEAD), headers)
    assert first[0]["type"] == "replay.truncated" and first[0]["seq"] == top + 1
    assert [e["type"] for e in first[1:]] == REBUILT_WAITING
    assert counter(redis, run) == first[-1]["seq"]
    for after in (AHEAD, first[-1]["seq"] + 1, 10**18 - 1):
        assert async_to_sync(_until_waiting)(run_path(run, after=after), headers) == first
    assert counter(redis, run) == first[-1]["seq"]


def test_a_page_whose_server_lost_its_data_follows_the_active_run_to_its_end(server, root_client, redis):
    run, waitpoint = waiting_run(server, root_client.user, chunks=20)
    seen = events(run)[-1]["seq"]  # the page showed the approval request
    redis.flushdb()  # Redis lost everything: the run's seqs, its buffer
    headers = headers_for(root_client.user)

    async def reconnect() -> list[dict[str, Any]]:
        comm = socket(run_path(run, after=seen), headers)
        assert (await comm.connect())[0]
        received = await until(comm, "run.waiting")
        await finish_in_thread(server, waitpoint, root_client.user)
        received += await until(comm, "run.end")
        await comm.disconnect()
        return received

    shown = followed(seen, async_to_sync(reconnect)())
    assert [e["type"] for e in shown] == REBUILT_WAITING + AFTER_APPROVAL
    assert shown[2]["text"] == "".join(f"w{n} " for n in range(20))
    assert shown[-1]["status"] == "completed" and shown[-1]["output"] == "Refunded."


def test_a_socket_open_while_its_server_lost_its_data_starts_over_and_reaches_the_end(
    server, root_client, redis, monkeypatch
):
    # The socket hears nothing once its group is gone with the data: it reads the buffer at quiet
    # times, which back off up to QUIET_WAITING_SECONDS (30 s) while the run waits. A short schedule,
    # set here, rather than one the test's own pace happens to keep short.
    monkeypatch.setattr(cursor, "QUIET_SECONDS", 0.1)
    monkeypatch.setattr(cursor, "QUIET_WAITING_SECONDS", 0.2)
    monkeypatch.setattr(consumers, "STATUS_SECONDS", 0.2)
    run, waitpoint = waiting_run(server, root_client.user)
    seen = events(run)[-1]["seq"]
    headers = headers_for(root_client.user)

    async def stay() -> list[dict[str, Any]]:
        comm = socket(run_path(run, after=seen), headers)
        assert (await comm.connect())[0]
        # It has replayed (nothing: it is up to date) once it answers a message.
        await comm.send_json_to({"type": "ping"})
        assert (await comm.receive_json_from(timeout=5))["code"] == "invalid_message"
        await sync_to_async(redis.flushdb)()
        # The run goes on numbering from 1: below the socket's seq, until it starts over.
        await finish_in_thread(server, waitpoint, root_client.user)
        received = await until(comm, "run.end")
        await comm.disconnect()
        return received

    shown = followed(seen, async_to_sync(stay)())
    # The page started over: it shows the run from its start, whenever the socket found out.
    assert shown[0]["type"] == "run.start"
    assert shown[-1]["type"] == "run.end" and shown[-1]["output"] == "Refunded."
    assert [e["type"] for e in shown if e["type"] == "tool.result"] == ["tool.result"]


def test_a_stream_whose_run_settled_with_its_new_seqs_below_the_streams_starts_over(
    server, root_client, redis
):
    # The race the test above runs into at times, made certain: Redis lost the run's data, the run
    # settled, and the events it numbered anew from 1 are still on their way to the buffer (they
    # are recorded a moment after their step is saved) when the open stream reads it. The buffer
    # holds nothing at the stream's seq; the settled run's rebuild, numbered after what it holds,
    # has another event there than the stream sent: what follows it there is not what follows
    # the stream's, and the page would show the run from its middle on.
    run, waitpoint = waiting_run(server, root_client.user)
    sent = events(run)[-1]
    redis.flushdb()
    finish_it(server, waitpoint, root_client.user)
    assert counter(redis, run) >= sent["seq"]
    redis.zremrangebyscore(f"chamvi:events:{run.pk}", 3, "+inf")
    redis.set(f"chamvi:seq:{run.pk}", 2)

    repaired = replay.missed_after(run.pk, sent["seq"], sent)
    assert replay.restarts(repaired, sent["seq"])
    shown = followed(sent["seq"], repaired)
    assert shown[0]["type"] == "run.start"
    assert shown[-1]["type"] == "run.end" and shown[-1]["output"] == "Refunded."
    # A stream that was sent that rebuild goes on inside it where it stopped.
    middle = shown[len(shown) // 2]
    assert replay.missed_after(run.pk, middle["seq"], middle) == shown[len(shown) // 2 + 1 :]


def forget(redis: Any, run: Run) -> None:
    """What an eviction of the run's keys does (they expire, so ``volatile-lru`` may pick them):
    its seqs and events go; the sockets' group memberships stay."""
    expire_buffer(redis, run)
    redis.delete(f"chamvi:seq:{run.pk}")


def finish_past(server: Any, waitpoint: WaitPoint, user: Any) -> Run:
    """Approve and finish the run with a second tool call: more events than it had while waiting."""
    later = [Reply(tool_call("c2", "add", '{"a": 1, "b": 2}'), finish("tool_calls"))]
    server.script("m-approving", [*later, Reply(text("Refunded."), finish("stop"))])
    approve(waitpoint.approval_id, by=user)
    try:
        return execute(waitpoint.run_id)
    finally:
        connection.close()  # the worker thread's: the test's teardown would find it open


WHOLE_RUN = [
    *REBUILT_WAITING[:-1],
    "tool.call",
    "tool.result",
    "step.start",
    "step.end",
    "tool.call",
    "tool.result",
    "step.start",
    "delta",
    "step.end",
    "run.end",
]


def test_a_socket_whose_run_was_numbered_anew_past_its_seq_starts_over(server, root_client, redis):
    # The run's seqs go, not the socket's group: the run numbers its next events from 1 and they
    # all arrive live, past the socket's seq. Sent as they come, the page would show the end of the
    # run after the start of its wait, as if nothing had happened in between.
    run, waitpoint = waiting_run(server, root_client.user, chunks=1)
    seen = events(run)[-1]["seq"]
    headers = headers_for(root_client.user)

    async def stay() -> list[dict[str, Any]]:
        comm = socket(run_path(run, after=seen), headers)
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "ping"})
        assert (await comm.receive_json_from(timeout=5))["code"] == "invalid_message"
        await sync_to_async(forget)(redis, run)
        await sync_to_async(finish_past, thread_sensitive=False)(server, waitpoint, root_client.user)
        received = await until(comm, "run.end")
        await comm.disconnect()
        return received

    shown = followed(seen, async_to_sync(stay)())
    assert [e["type"] for e in shown if e["type"] != "run.resume"] == WHOLE_RUN
    assert shown[-1]["status"] == "completed" and shown[-1]["output"] == "Refunded."


def test_a_server_sent_stream_whose_run_was_numbered_anew_past_its_seq_starts_over(
    server, root_client, redis
):
    run, waitpoint = waiting_run(server, root_client.user, chunks=1)
    seen = events(run)[-1]["seq"]

    async def stay() -> list[dict[str, Any]]:
        stream = Stream(
            await sync_to_async(root_client.get)(
                f"/chamvi/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID=str(seen - 1)
            )
        )
        # The stream follows the run once it has sent what it replays: the approval request.
        received = [await stream.next()]
        assert received[0] is not None and received[0]["seq"] == seen
        await sync_to_async(forget)(redis, run)
        await sync_to_async(finish_past, thread_sensitive=False)(server, waitpoint, root_client.user)
        received += await stream.until("run.end")
        await stream.close()
        return received

    shown = followed(seen - 1, async_to_sync(stay)())
    assert [e["type"] for e in shown if e["type"] != "run.resume"] == WHOLE_RUN
    assert shown[-1]["output"] == "Refunded."
