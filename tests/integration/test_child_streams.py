"""A parent's streams carry its child runs (SPEC §13): a child's events reach the parent's run
socket, its thread socket and its Server-Sent Events, each naming its ``parent_run_id``; a child's
approval is decided from the parent's socket; the parent's stream ends with the parent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from chamvi_runs import start_run
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.routing import websocket_application
from tests.support.helpers import events, execute, make_superuser, make_user, session_cookie
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.support.sse_helpers import body, parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

HOST = (b"host", b"127.0.0.1")
REFUND = json.dumps({"order_id": "o-7", "amount_cents": 500})


def _headers(user: Any) -> list[tuple[bytes, bytes]]:
    return [HOST, (b"origin", b"http://127.0.0.1"), (b"cookie", session_cookie(user).encode())]


def _script(server, *, to_the_end: bool) -> None:
    """The parent delegates, the child asks to refund; ``to_the_end``: both then answer."""
    ends = to_the_end
    server.script(
        "m-triage",
        [
            Reply(tool_call("c1", "billing", '{"task": "refund order 7"}'), finish("tool_calls")),
            *([Reply(text("Refunded."), finish("stop"))] if ends else []),
        ],
    )
    server.script(
        "m-billing",
        [
            Reply(tool_call("r1", "refund", REFUND), finish("tool_calls")),
            *([Reply(text("Done: 5.00 back."), finish("stop"))] if ends else []),
        ],
    )


def _waiting_child(
    server, owner: Any, thread: str | None = None, *, to_the_end: bool = False
) -> tuple[Run, Run, WaitPoint]:
    """A triage run that delegated to billing, whose refund waits for an approval."""
    _script(server, to_the_end=to_the_end)
    parent = execute(start_run("triage", "x", created_by=owner, thread=thread))
    (child,) = Run.objects.filter(parent=parent)
    child = execute(child)
    assert child.status == "waiting"
    return parent, child, WaitPoint.objects.get(run=child)


async def _until(comm: WebsocketCommunicator, done) -> list[dict[str, Any]]:
    received = []
    while True:
        event = await comm.receive_json_from(timeout=10)
        received.append(event)
        if done(event):
            return received


def _gapless(stream: list[dict[str, Any]], run_id: str) -> None:
    seqs = [e["seq"] for e in stream if e["run_id"] == run_id]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def test_the_parents_socket_shows_its_childs_approval_and_decides_it(server):
    owner = make_superuser("owner")
    parent, child, wait = _waiting_child(server, owner, to_the_end=True)

    headers = _headers(owner)

    async def scenario() -> list[dict[str, Any]]:
        comm = WebsocketCommunicator(
            websocket_application(), f"/ws/chamvi/runs/{parent.pk}/", headers=headers
        )
        assert (await comm.connect())[0]
        # The replay: the child's events, up to its open approval, then the parent's (which come with
        # the ack): a parent's socket replays its children first, so that its run.end comes last.
        seen = await _until(comm, lambda e: e["type"] == "run.waiting")
        await comm.send_json_to({"type": "approve", "approval_id": wait.approval_id})
        seen += await _until(comm, lambda e: e["type"] == "ack")
        await comm.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    theirs = [e for e in seen if e.get("run_id") == child.pk]
    assert theirs and all(e["parent_run_id"] == parent.pk for e in theirs)
    assert not [e for e in seen if e.get("run_id") == parent.pk and "parent_run_id" in e]
    start = next(e for e in theirs if e["type"] == "run.start")
    assert start["parent"] == {"run_id": parent.pk, "step": 0, "position": 0}
    waiting = next(e for e in theirs if e["type"] == "run.waiting")
    assert (waiting["approval_id"], waiting["tool_name"]) == (wait.approval_id, "refund")
    assert seen[-1] == {"type": "ack", "action": "approve", "approval_id": wait.approval_id}
    assert WaitPoint.objects.get(pk=wait.pk).decision == "approved"
    _gapless([e for e in seen if "seq" in e], child.pk)

    # Live: the child finishes, the parent resumes and ends; a socket open on the parent hears it all.
    headers = _headers(owner)

    async def live() -> list[dict[str, Any]]:
        last = max(e["seq"] for e in seen if e.get("run_id") == parent.pk)
        comm = WebsocketCommunicator(
            websocket_application(),
            f"/ws/chamvi/runs/{parent.pk}/?after={last}&resume={child.pk}:{waiting['seq']}",
            headers=headers,
        )
        assert (await comm.connect())[0]
        await sync_to_async(execute)(child.pk)
        await sync_to_async(execute)(parent.pk)
        got = await _until(comm, lambda e: e["type"] == "run.end" and e["run_id"] == parent.pk)
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return got

    got = async_to_sync(live)()
    ends = [(e["run_id"], e["status"]) for e in got if e["type"] == "run.end"]
    assert ends == [(child.pk, "completed"), (parent.pk, "completed")]
    assert next(e["seq"] for e in got if e["run_id"] == child.pk) == waiting["seq"] + 1


def test_a_childs_approval_cannot_be_decided_from_another_runs_socket(server):
    owner = make_superuser("owner")
    _parent, _child, wait = _waiting_child(server, owner)
    server.script("m-basic", [Reply(text("hi"), finish("stop"))])
    other = execute(start_run("basic", "x", created_by=owner))

    headers = _headers(owner)

    async def scenario() -> dict[str, Any]:
        comm = WebsocketCommunicator(websocket_application(), f"/ws/chamvi/runs/{other.pk}/", headers=headers)
        assert (await comm.connect())[0]
        await _until(comm, lambda e: e["type"] == "run.end")
        await comm.send_json_to({"type": "approve", "approval_id": wait.approval_id})
        reply = await comm.receive_json_from(timeout=10)
        await comm.disconnect()
        return reply

    assert async_to_sync(scenario)()["code"] == "not_found"
    assert WaitPoint.objects.get(pk=wait.pk).decision is None


def test_the_thread_socket_shows_a_child_of_its_run_and_decides_its_approval(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    parent, child, wait = _waiting_child(server, owner, thread="t-delegating")

    headers = _headers(owner)

    async def scenario() -> list[dict[str, Any]]:
        comm = WebsocketCommunicator(
            websocket_application(), "/ws/chamvi/threads/t-delegating/", headers=headers
        )
        assert (await comm.connect())[0]
        seen = await _until(comm, lambda e: e["type"] == "run.waiting" and e["run_id"] == child.pk)
        await comm.send_json_to({"type": "approve", "approval_id": wait.approval_id})
        seen += await _until(comm, lambda e: e["type"] == "ack")
        await comm.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    assert seen[-1] == {"type": "ack", "action": "approve", "approval_id": wait.approval_id}
    assert WaitPoint.objects.get(pk=wait.pk).decision == "approved"
    seen = seen[:-1]
    assert {e["run_id"] for e in seen} == {parent.pk, child.pk}
    assert all(e.get("parent_run_id") == parent.pk for e in seen if e["run_id"] == child.pk)
    assert next(e for e in seen if e["run_id"] == child.pk and e["type"] == "run.waiting")["approval_id"] == (
        wait.approval_id
    )


def test_the_parents_event_stream_carries_its_child_and_ends_with_the_parent(server, client):
    owner = make_superuser("owner")
    parent, child, wait = _waiting_child(server, owner, to_the_end=True)
    from chamvi_runs import approve

    approve(wait.approval_id, by=owner)
    execute(Run.objects.get(pk=child.pk))
    assert execute(Run.objects.get(pk=parent.pk)).status == "completed"
    client.force_login(owner)
    streamed = parse(body(client.get(f"/chamvi/api/runs/{parent.pk}/stream/")))
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["run_id"] == parent.pk
    assert [e for e in streamed if e["run_id"] == parent.pk] == events(parent)
    assert [e for e in streamed if e["run_id"] == child.pk] == events(Run.objects.get(pk=child.pk))
    assert all(e["parent_run_id"] == parent.pk for e in streamed if e["run_id"] == child.pk)


def test_the_parents_event_stream_names_only_its_own_seqs_and_resumes_a_child(server, client):
    owner = make_superuser("owner")
    parent, child, wait = _waiting_child(server, owner, to_the_end=True)
    from chamvi_runs import approve

    approve(wait.approval_id, by=owner)
    child = execute(child.pk)
    assert execute(parent.pk).status == "completed"
    client.force_login(owner)
    raw = body(client.get(f"/chamvi/api/runs/{parent.pk}/stream/?after=0")).decode()
    # Last-Event-ID is the parent's seq: a child's frames carry none.
    ids = [int(line[4:]) for line in raw.splitlines() if line.startswith("id: ")]
    assert ids == [e["seq"] for e in events(parent)]
    # A client that has the child up to a seq names it in resume: only what follows comes again.
    child_events = events(child)
    resumed = parse(body(client.get(f"/chamvi/api/runs/{parent.pk}/stream/?after=0&resume={child.pk}:2")))
    assert [e["seq"] for e in resumed if e["run_id"] == child.pk] == [e["seq"] for e in child_events[2:]]
    response = client.get(f"/chamvi/api/runs/{parent.pk}/stream/?resume=nonsense")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field"
