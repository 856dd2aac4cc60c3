"""A websocket that stays idle (its run waits for approval) on a real daphne with channels-redis and a
real worker: redis-py 8 times reads out after 5 s by default, which used to close it with 1011."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chamvi_runs import approve, start_run
from chamvi_runs.models import Run, Step, WaitPoint
from tests.integration.test_websocket import REFUND, assert_gapless
from tests.support.helpers import events, make_user, session_cookie
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.support.ws_client import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

IDLE_SECONDS = 65


def test_a_socket_idle_for_over_a_minute_gets_the_events_after_the_approval(server):
    owner = make_user("owner", "chamvi_runs.approve_waitpoint")
    server.script(
        "m-approving",
        [
            Reply(text("Refunding."), tool_call("c1", "refund", REFUND), finish("tool_calls")),
            Reply(text("Refunded "), text("5 cents."), finish("stop")),
        ],
    )
    env = worker_env(server.base_url)
    web, worker = WebProcess(env), WorkerProcess(env)
    try:
        wait_for(worker.ready, 60, worker.output)
        run = start_run("approving", {"order": "o"}, created_by=owner)
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "waiting", 60, worker.output)
        waitpoint = WaitPoint.objects.get(run=run)
        cookie = session_cookie(owner)

        async def scenario():
            socket = await Socket.open(web.port, f"/ws/chamvi/runs/{run.pk}/?after=0", cookie)
            before = await socket.until("run.waiting", timeout=30)
            started = time.monotonic()
            idle = await socket.quiet_for(IDLE_SECONDS)
            idled = time.monotonic() - started
            if idle:
                await socket.close()
                return before, idle, idled, [], []
            await sync_to_async(approve)(waitpoint.approval_id, by=owner)
            after = await socket.until("run.end", timeout=60)
            trailing = await socket.quiet_for(0.5)
            await socket.close()
            return before, idle, idled, after, trailing

        before, idle, idled, after, trailing = async_to_sync(scenario)()
        log = web.output()
    finally:
        worker.stop()
        web.stop()
    assert idled >= 60
    assert idle == [], f"while the run waited the socket got {idle}"
    assert trailing == []
    stream = before + after
    assert stream == events(run)
    assert_gapless(stream)
    assert before[-1]["approval_id"] == waitpoint.approval_id
    assert after[0]["type"] == "run.resume" and after[-1]["status"] == "completed"
    final = Step.objects.filter(run=run, kind="llm").order_by("-index").first()
    texts = "".join(e["text"] for e in after if e["type"] == "delta")
    assert texts == final.output["text"] == "Refunded 5 cents."
    assert "TimeoutError" not in log, log[-3000:]
