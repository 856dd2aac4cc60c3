"""The websocket contract (SPEC §8): who may subscribe, replay after a seq, live events, steering."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from chamvi_runs import start_run
from chamvi_runs.models import Run, RunInput, Step, WaitPoint
from chamvi_runs.routing import websocket_application
from chamvi_runs.streaming import cursor, replay
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster
from chamvi_runs.web import consumers
from tests.support.helpers import (
    events,
    execute,
    execute_in_thread,
    execute_losing_run_end,
    make_superuser,
    make_user,
    session_cookie,
)
from tests.support.scripted_server import Reply, delay, finish, reasoning, text, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

HOST = (b"host", b"127.0.0.1")
REFUND = '{"order_id": "o", "amount_cents": 5}'


# --- helpers --------------------------------------------------------------------------------------


def headers_for(user: Any = None, origin: bytes = b"http://127.0.0.1") -> list[tuple[bytes, bytes]]:
    """Handshake headers: the Host, the Origin (a page of the site, by default), and a session cookie
    of ``user`` (none: anonymous)."""
    headers = [HOST, (b"origin", origin)]
    if user is not None:
        headers.append((b"cookie", session_cookie(user).encode()))
    return headers


def socket(path: str, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(websocket_application(), path, headers=headers)


def run_path(run: Run | str, after: int | None = None) -> str:
    run_id = run if isinstance(run, str) else run.pk
    return f"/ws/chamvi/runs/{run_id}/" + (f"?after={after}" if after is not None else "")


async def receive_until_end(comm: WebsocketCommunicator, runs: int = 1) -> list[dict[str, Any]]:
    """Every message up to the ``runs``-th run.end, then check that nothing else follows."""
    received: list[dict[str, Any]] = []
    ends = 0
    while ends < runs:
        event = await comm.receive_json_from(timeout=10)
        received.append(event)
        ends += event["type"] == "run.end"
    assert await comm.receive_nothing(timeout=0.3), "an event arrived after run.end"
    return received


async def expect_forbidden(comm: WebsocketCommunicator) -> None:
    """Accepted, then closed at once with 4403 and nothing before the close."""
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_output(timeout=5)
    assert message == {"type": "websocket.close", "code": 4403}


def received_until_end(path: str, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """Every event a socket connecting to ``path`` receives up to run.end (and nothing after it)."""

    async def scenario() -> list[dict[str, Any]]:
        comm = socket(path, headers)
        assert (await comm.connect())[0]
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    return async_to_sync(scenario)()


def completed_run(server, owner: Any, thread: str | None = None) -> Run:
    server.script("m-basic", [Reply(reasoning("hm"), text("Hel"), text("lo"), text("!"), finish("stop"))])
    run = execute(start_run("basic", "go", created_by=owner, thread=thread))
    assert run.status == "completed"
    return run


def waiting_run(server, owner: Any) -> tuple[Run, WaitPoint]:
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund", created_by=owner))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


def assert_gapless(stream: list[dict[str, Any]], first: int = 1) -> None:
    assert [e["seq"] for e in stream] == list(range(first, first + len(stream)))


# --- who may subscribe ----------------------------------------------------------------------------


def test_a_user_the_policy_refuses_is_closed_with_4403_and_gets_no_event(server):
    owner, stranger = make_user("owner"), make_user("stranger", "chamvi_runs.change_run")
    run = completed_run(server, owner)
    count = len(events(run))
    assert count, "the run has events a subscriber could be sent"
    refused, allowed = headers_for(stranger), headers_for(owner)

    async def scenario():
        comm = socket(run_path(run, after=0), refused)
        await expect_forbidden(comm)
        # No group was joined: a new event of the run reaches the owner's socket, not this one.
        owners = socket(run_path(run, after=count), allowed)
        assert (await owners.connect())[0]
        await sync_to_async(ChannelsBroadcaster(None).publish)(run.pk, {"type": "probe"})
        assert (await owners.receive_json_from(timeout=5))["type"] == "probe"
        assert await comm.receive_nothing(timeout=0.3)
        await owners.disconnect()
        await comm.disconnect()

    async_to_sync(scenario)()


def test_an_anonymous_user_is_closed_with_4403(server):
    run = completed_run(server, make_user("owner"))
    headers = headers_for(None)

    async def scenario():
        comm = socket(run_path(run, after=0), headers)
        await expect_forbidden(comm)
        await comm.disconnect()

    async_to_sync(scenario)()


def test_an_unknown_run_is_closed_with_4403():
    headers = headers_for(make_user("viewer", "chamvi_runs.view_run"))

    async def scenario():
        comm = socket(run_path("run_doesnotexist"), headers)
        await expect_forbidden(comm)
        await comm.disconnect()

    async_to_sync(scenario)()


def test_a_bad_origin_is_refused_at_the_handshake():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner, origin=b"http://evil.example")

    async def scenario():
        comm = socket(run_path(run), headers)
        connected, _ = await comm.connect()
        assert not connected
        await comm.wait()

    async_to_sync(scenario)()


# --- replay ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["creator", "superuser", "view_run"])
def test_replay_after_zero_then_after_three(server, who):
    owner = make_user("owner")
    viewer = {
        "creator": owner,
        "superuser": make_superuser(),
        "view_run": make_user("viewer", "chamvi_runs.view_run"),
    }[who]
    run = completed_run(server, owner)
    stored = events(run)
    headers = headers_for(viewer)

    async def scenario():
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        first = await receive_until_end(comm)
        await comm.disconnect()
        comm = socket(run_path(run, after=3), headers)
        assert (await comm.connect())[0]
        second = await receive_until_end(comm)
        await comm.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    assert first == stored
    assert_gapless(first)
    assert first[0]["type"] == "run.start" and first[-1]["type"] == "run.end"
    assert {e["run_id"] for e in first} == {run.pk}
    assert second == [e for e in stored if e["seq"] > 3]
    assert_gapless(second, first=4)


def test_without_after_a_socket_replays_from_the_start(server):
    owner = make_user("owner")
    run = completed_run(server, owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    assert async_to_sync(scenario)() == events(run)


def test_an_old_run_whose_buffer_expired_is_served_from_its_stored_steps(server, redis):
    owner = make_user("owner")
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 2, "b": 3}'), finish("tool_calls")),
            Reply(reasoning("so"), text("It is "), text("5."), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "add", created_by=owner))
    assert run.status == "completed"
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:seq:{run.pk}")
    assert events(run) == []
    headers = headers_for(owner)
    stream = received_until_end(run_path(run, after=0), headers)
    assert_gapless(stream)
    assert [e["type"] for e in stream] == [
        "run.start",
        "step.start",
        "step.end",
        "tool.call",
        "tool.result",
        "step.start",
        "delta",
        "delta",
        "step.end",
        "run.end",
    ]
    assert {k: stream[3][k] for k in ("run_id", "seq", "step", "name", "input")} == {
        "run_id": run.pk,
        "seq": 4,
        "step": 1,
        "name": "add",
        "input": {"a": 2, "b": 3},
    }
    assert stream[4]["output"] == 5
    llm = Step.objects.get(run=run, index=2)
    text_deltas = "".join(e["text"] for e in stream if e["type"] == "delta" and e["kind"] == "text")
    assert text_deltas == llm.output["text"] == "It is 5."
    assert stream[-1]["status"] == "completed" and stream[-1]["output"] == "It is 5."
    # A seq the server no longer knows may be of the stream the client watched live, numbered
    # otherwise: the resumed client gets a restart, the whole rebuild behind a marker below its seq.
    resumed = received_until_end(run_path(run, after=8), headers)
    assert resumed[0] == {
        "type": "replay.truncated",
        "run_id": run.pk,
        "seq": 0,
        "status": "completed",
        "from_step": 0,
    }
    assert resumed[1:] == stream


# --- live -----------------------------------------------------------------------------------------


def test_live_events_of_a_queued_run_arrive_in_order_without_duplicates(server):
    owner = make_user("owner")
    server.script(
        "m-basic",
        [Reply(text("Hel"), text("lo "), delay(0.5), text("there"), finish("stop"))],
    )
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run, after=0), headers)
        assert (await comm.connect())[0]
        assert await comm.receive_nothing(timeout=0.2), "a queued run has no events yet"
        execution = asyncio.ensure_future(execute_in_thread(run.pk))
        received = [await comm.receive_json_from(timeout=10) for _ in range(3)]
        # The first events arrive while the model is still answering: they are live, not replayed.
        assert not execution.done()
        received += await receive_until_end(comm)
        await comm.disconnect()
        return received, await execution

    received, run = async_to_sync(scenario)()
    assert run.status == "completed"
    assert_gapless(received)
    assert received == events(run)
    types = [e["type"] for e in received]
    assert types[:2] == ["run.start", "step.start"] and types[-2:] == ["step.end", "run.end"]
    assert set(types[2:-2]) == {"delta"}
    step = Step.objects.get(run=run, kind="llm")
    assert (
        "".join(e["text"] for e in received if e["type"] == "delta") == step.output["text"] == "Hello there"
    )


def test_a_socket_after_a_seq_the_run_has_not_reached_starts_over_and_gets_every_event(server):
    owner = make_user("owner")
    server.script("m-basic", [Reply(text("a"), text("b"), text("c"), finish("stop"))])
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run, after=2), headers)
        assert (await comm.connect())[0]
        received = [await comm.receive_json_from(timeout=5)]
        await execute_in_thread(run.pk)
        received += await receive_until_end(comm)
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    # No server sent seq 2 of a queued run: the client is told to start over (a marker at 0, stored
    # nowhere), then gets the run from its first event, live.
    assert received[0] == {
        "type": "replay.truncated",
        "run_id": run.pk,
        "seq": 0,
        "status": "queued",
        "from_step": 0,
    }
    assert received[1:] == events(run)
    assert_gapless(received, first=0)


def test_a_thread_socket_receives_the_events_of_every_run_of_the_thread(server):
    owner = make_user("owner")
    first = completed_run(server, owner, thread="support/42 é")
    second = start_run("basic", "again", created_by=owner, thread="support/42 é")
    other = start_run("basic", "elsewhere", created_by=owner, thread="another")
    server.script("m-basic", [Reply(text("second"), finish("stop")), Reply(text("other"), finish("stop"))])
    headers = headers_for(owner)

    async def scenario():
        comm = socket("/ws/chamvi/threads/support%2F42%20%C3%A9/?after=0", headers)
        assert (await comm.connect())[0]
        replayed = await receive_until_end(comm)
        await execute_in_thread(second.pk)
        await execute_in_thread(other.pk)
        live = await receive_until_end(comm)
        await comm.disconnect()
        return replayed, live

    replayed, live = async_to_sync(scenario)()
    assert replayed == events(first)
    assert live == events(second)
    assert_gapless(live)


def test_a_thread_socket_resumes_each_run_after_the_seq_its_client_names(server):
    owner = make_user("owner")
    first = completed_run(server, owner, thread="t-resume")
    second = completed_run(server, owner, thread="t-resume")
    elsewhere = completed_run(server, owner, thread="t-other")
    top = events(first)[-1]["seq"]
    resume = f"{first.pk}:{top - 2},{second.pk}:{events(second)[-1]['seq']},{elsewhere.pk}:0"
    received = received_until_end(f"/ws/chamvi/threads/t-resume/?after=0&resume={resume}", headers_for(owner))
    # Of the first run only what comes after the client's seq; nothing of the second, which it has
    # whole, nor of a run of another thread that it names.
    assert received == events(first)[-2:]


def test_a_thread_socket_whose_run_lost_its_seqs_serves_a_resuming_client_up_to_run_end(server, redis):
    owner = make_user("owner")
    run = completed_run(server, owner, thread="t-lost")
    stream = events(run)
    # Redis lost its data after the page had been sent all but run.end.
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:seq:{run.pk}", f"chamvi:region:{run.pk}")
    seen = stream[-2]["seq"]
    received = received_until_end(
        f"/ws/chamvi/threads/t-lost/?after=0&resume={run.pk}:{seen}", headers_for(owner)
    )
    # A restart: the run rebuilt from 1, behind a marker at 0 that the client takes below its seq.
    assert received[0]["type"] == "replay.truncated" and received[0]["seq"] == 0
    assert_gapless(received, first=0)
    assert received[-1]["type"] == "run.end" and received[-1]["output"] == stream[-1]["output"]
    text = "".join(e["text"] for e in received if e["type"] == "delta" and e["kind"] == "text")
    assert text == "Hello!"


def assert_run_end(event: dict[str, Any], run: Run) -> None:
    assert event | {"seq": 0} == {
        "type": "run.end",
        "run_id": run.pk,
        "seq": 0,
        "status": "completed",
        "output": "Hello",
        "error": None,
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        "inputs": [],
        "decisions": [],
    }


@pytest.mark.parametrize("watch", ["run", "thread"])
def test_a_socket_watching_a_run_gets_the_run_end_that_never_reached_the_buffer(server, monkeypatch, watch):
    owner = make_user("owner")
    server.script("m-basic", [Reply(text("Hel"), text("lo"), finish("stop"))])
    run = start_run("basic", "go", created_by=owner, thread="t-end")
    # A minute of quiet, and the time a run.end may be on its way (both shortened here).
    monkeypatch.setattr(consumers, "STATUS_SECONDS", 0.5)
    monkeypatch.setattr(replay, "END_GRACE_SECONDS", 0)
    path = run_path(run) if watch == "run" else "/ws/chamvi/threads/t-end/"
    headers = headers_for(owner)

    async def scenario():
        comm = socket(path, headers)
        assert (await comm.connect())[0]
        await execute_in_thread(run.pk, True)
        received = await receive_until_end(comm)
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    run.refresh_from_db()
    assert run.status == "completed"
    assert_gapless(received)
    assert received == events(run)
    assert [e["type"] for e in received].count("run.end") == 1
    assert_run_end(received[-1], run)


def test_a_page_opened_after_a_run_end_was_lost_gets_it_when_it_connects(server, monkeypatch):
    owner = make_user("owner")
    server.script("m-basic", [Reply(text("Hel"), text("lo"), finish("stop"))])
    run = execute_losing_run_end(start_run("basic", "go", created_by=owner))
    assert run.status == "completed" and "run.end" not in [e["type"] for e in events(run)]
    monkeypatch.setattr(replay, "END_GRACE_SECONDS", 0)
    received = received_until_end(run_path(run, after=2), headers_for(owner))
    assert_gapless(received, first=3)
    assert_run_end(received[-1], run)


def test_a_thread_socket_does_not_watch_a_settled_run_its_client_has_to_the_end(server, monkeypatch):
    owner = make_user("owner")
    run = completed_run(server, owner, thread="t-done")
    top = events(run)[-1]["seq"]
    monkeypatch.setattr(replay, "END_GRACE_SECONDS", 0)
    monkeypatch.setattr(cursor, "QUIET_SECONDS", 0.05)
    monkeypatch.setattr(cursor, "QUIET_MAX_SECONDS", 0.1)
    reads: list[str] = []
    missed_after = consumers.missed_after

    def reading(run_id: str, after: int, sent: dict[str, Any] | None) -> list[dict[str, Any]]:
        reads.append(run_id)
        return missed_after(run_id, after, sent)

    monkeypatch.setattr(consumers, "missed_after", reading)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(f"/ws/chamvi/threads/t-done/?after=0&resume={run.pk}:{top}", headers)
        assert (await comm.connect())[0]
        assert await comm.receive_nothing(timeout=1)
        await comm.disconnect()

    async_to_sync(scenario)()
    # Nothing is left to come of it: no reading of the buffer ten times a second, for good.
    assert reads == []


def test_a_thread_socket_does_not_leak_runs_another_user_starts_in_the_thread(server):
    # A user who may view every run may also start one in someone else's thread; its owner may not
    # view that run, so their socket does not forward it.
    owner, viewer = make_user("owner"), make_user("viewer", "chamvi_runs.view_run")
    completed_run(server, owner, thread="t-1")
    intruder = start_run("basic", "peek", created_by=viewer, thread="t-1")
    mine = start_run("basic", "mine", created_by=owner, thread="t-1")
    server.script("m-basic", [Reply(text("theirs"), finish("stop")), Reply(text("mine"), finish("stop"))])
    headers = headers_for(owner)

    async def scenario():
        comm = socket("/ws/chamvi/threads/t-1/", headers)
        assert (await comm.connect())[0]
        await receive_until_end(comm)  # the first run's replay
        await execute_in_thread(intruder.pk)
        await execute_in_thread(mine.pk)
        live = await receive_until_end(comm)
        await comm.disconnect()
        return live

    live = async_to_sync(scenario)()
    assert {e["run_id"] for e in live} == {mine.pk}


def test_a_thread_socket_of_another_users_thread_is_closed_with_4403(server):
    owner, stranger = make_user("owner"), make_user("stranger")
    completed_run(server, owner, thread="t-2")
    headers = headers_for(stranger)

    async def scenario():
        comm = socket("/ws/chamvi/threads/t-2/", headers)
        await expect_forbidden(comm)
        await comm.disconnect()

    async_to_sync(scenario)()


# --- client -> server -----------------------------------------------------------------------------


async def reply_to(comm: WebsocketCommunicator) -> dict[str, Any]:
    """The next ack or error, skipping run events (a socket replays the run's events first)."""
    while True:
        message = await comm.receive_json_from(timeout=5)
        if "seq" not in message:
            return message


async def refused_and_closed(
    comm: WebsocketCommunicator, message: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send ``message`` on a socket that must refuse it and close: its reply, then its close."""
    await comm.send_json_to(message)
    reply = await comm.receive_json_from(timeout=5)
    closed = await comm.receive_output(timeout=5)
    await comm.disconnect()
    return reply, closed


async def command(path: str, headers, message: Any, *, raw: str | None = None) -> dict[str, Any]:
    comm = socket(path, headers)
    assert (await comm.connect())[0]
    if raw is not None:
        await comm.send_to(text_data=raw)
    else:
        await comm.send_json_to(message)
    reply = await reply_to(comm)
    # The socket is still open and answers the next message.
    await comm.send_json_to({"type": "nonsense"})
    assert (await reply_to(comm))["type"] == "error"
    await comm.disconnect()
    return reply


def test_cancel_over_the_socket_cancels_a_queued_run():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "cancel"})
        messages = [await comm.receive_json_from(timeout=5) for _ in range(2)]
        await comm.disconnect()
        return messages

    messages = async_to_sync(scenario)()
    by_type = {m["type"]: m for m in messages}
    assert by_type["ack"] == {"type": "ack", "action": "cancel", "status": "cancelled"}
    # The socket also sees the run end.
    assert by_type["run.end"]["status"] == "cancelled" and by_type["run.end"]["seq"] == 1
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_cancel_by_a_viewer_who_may_not_steer_is_refused():
    owner, viewer = make_user("owner"), make_user("viewer", "chamvi_runs.view_run")
    run = start_run("basic", "go", created_by=owner)
    reply = async_to_sync(command)(run_path(run), headers_for(viewer), {"type": "cancel"})
    assert reply["type"] == "error" and reply["code"] == "forbidden"
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_input_over_the_socket_records_a_run_input():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    reply = async_to_sync(command)(run_path(run), headers_for(owner), {"type": "input", "payload": "hi"})
    item = RunInput.objects.get(run=run)
    assert reply == {"type": "ack", "action": "input", "input_id": item.pk}
    assert item.payload == "hi" and item.consumed_step is None


def test_input_to_a_settled_run_is_an_error_reply(server):
    owner = make_user("owner")
    run = completed_run(server, owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        await receive_until_end(comm)
        await comm.send_json_to({"type": "input", "payload": "too late"})
        reply = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return reply

    reply = async_to_sync(scenario)()
    assert reply["type"] == "error" and reply["code"] == "run_settled"
    assert not RunInput.objects.exists()


def test_approve_over_the_socket_by_a_user_allowed_to_decide(server):
    owner = make_user("owner")
    approver = make_user("approver", "chamvi_runs.view_run", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    message = {"type": "approve", "approval_id": waitpoint.approval_id, "reason": "ok"}
    reply = async_to_sync(command)(run_path(run), headers_for(approver), message)
    assert reply == {"type": "ack", "action": "approve", "approval_id": waitpoint.approval_id}
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.decided_by_id, waitpoint.reason) == ("approved", approver.pk, "ok")
    server.script("m-approving", [Reply(text("done"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.output == "done"
    assert Refund.objects.count() == 1


def test_deny_over_the_socket(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    message = {"type": "deny", "approval_id": waitpoint.approval_id}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), message)
    assert reply == {"type": "ack", "action": "deny", "approval_id": waitpoint.approval_id}
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "denied"


def test_approve_by_a_user_without_the_permission_is_refused(server):
    owner = make_user("owner")
    run, waitpoint = waiting_run(server, owner)
    message = {"type": "approve", "approval_id": waitpoint.approval_id}
    reply = async_to_sync(command)(run_path(run), headers_for(owner), message)
    assert reply["type"] == "error" and reply["code"] == "forbidden"
    waitpoint.refresh_from_db()
    assert waitpoint.decision is None and Run.objects.get(pk=run.pk).status == "waiting"


def test_a_second_decision_over_the_socket_is_an_error_reply(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        replies = []
        for kind in ("deny", "approve"):
            await comm.send_json_to({"type": kind, "approval_id": waitpoint.approval_id})
            replies.append(await reply_to(comm))
        await comm.disconnect()
        return replies

    denied, approved = async_to_sync(scenario)()
    assert denied["type"] == "ack"
    assert approved["type"] == "error" and approved["code"] == "already_decided"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "denied"


class DecideOwnRunsPolicy:
    """A site policy: only the run's creator decides its approvals."""

    def can_view(self, user, run):
        return user.is_authenticated and run.created_by_id == user.pk

    can_steer = can_view
    can_cancel = can_view
    can_decide = can_view

    def can_start(self, user, agent):
        return user.is_authenticated


def test_an_approval_of_another_run_is_checked_against_that_run(server, settings):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "POLICY": f"{__name__}.DecideOwnRunsPolicy"}
    owner, stranger = make_user("owner"), make_user("stranger")
    theirs, waitpoint = waiting_run(server, owner)
    mine = start_run("basic", "mine", created_by=stranger)
    message = {"type": "approve", "approval_id": waitpoint.approval_id}
    reply = async_to_sync(command)(run_path(mine), headers_for(stranger), message)
    assert reply["type"] == "error"
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
    assert Run.objects.get(pk=theirs.pk).status == "waiting"
    # Nor can a run socket be used to steer another run by naming it.
    message = {"type": "cancel", "run_id": theirs.pk}
    reply = async_to_sync(command)(run_path(mine), headers_for(stranger), message)
    assert reply["type"] == "error"
    assert Run.objects.get(pk=theirs.pk).status == "waiting"
    assert Run.objects.get(pk=mine.pk).status == "queued"


@pytest.mark.parametrize(
    "raw",
    ["not json", "[1, 2]", '"text"', '{"type": "launch"}', "{}", '{"type": "approve"}'],
)
def test_bad_messages_get_an_error_reply_not_a_disconnect(raw):
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    reply = async_to_sync(command)(run_path(run), headers_for(owner), None, raw=raw)
    assert reply["type"] == "error" and reply["code"] == "invalid_message"
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_a_binary_frame_gets_an_error_reply_not_a_disconnect():
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    headers = headers_for(owner)

    async def scenario():
        comm = socket(run_path(run), headers)
        assert (await comm.connect())[0]
        await comm.send_to(bytes_data=b"\x00\x01")
        reply = await comm.receive_json_from(timeout=5)
        await comm.send_json_to({"type": "input", "payload": {"n": 1}})
        ack = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return reply, ack

    reply, ack = async_to_sync(scenario)()
    assert reply["type"] == "error" and reply["code"] == "invalid_message"
    assert ack["type"] == "ack" and RunInput.objects.get(pk=ack["input_id"]).payload == {"n": 1}


def test_a_thread_socket_steers_only_runs_of_its_thread_named_by_run_id():
    owner = make_user("owner")
    inside = start_run("basic", "in", created_by=owner, thread="t-3")
    outside = start_run("basic", "out", created_by=owner, thread="t-4")
    headers = headers_for(owner)
    path = "/ws/chamvi/threads/t-3/"
    reply = async_to_sync(command)(path, headers, {"type": "cancel", "run_id": outside.pk})
    assert reply["type"] == "error" and reply["code"] == "not_found"
    assert Run.objects.get(pk=outside.pk).status == "queued"
    reply = async_to_sync(command)(path, headers, {"type": "cancel"})
    assert reply["type"] == "error" and reply["code"] == "not_found"
    reply = async_to_sync(command)(path, headers, {"type": "cancel", "run_id": inside.pk})
    assert reply == {"type": "ack", "action": "cancel", "status": "cancelled"}
    assert Run.objects.get(pk=inside.pk).status == "cancelled"
