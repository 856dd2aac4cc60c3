"""Notifiers: the janitor does not call one again while the first call runs, two janitors never call
it twice for one wait point, and a failing notifier backs off longer each time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from chamvi_runs import approve, start_run, store
from chamvi_runs.agents.agent import registry
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.runtime.notifications import notify
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def test_the_janitor_does_not_resend_while_the_first_notifier_call_is_still_running(server):
    agent = registry.get("approving")
    entered, release = threading.Event(), threading.Event()
    tokens: list[str] = []

    def slow_mail(run, waitpoint) -> None:
        tokens.append(waitpoint.token)
        entered.set()
        release.wait(20)

    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    agent.notifier = slow_mail
    try:
        worker = threading.Thread(target=lambda: (execute(start_run("approving", "x")), connection.close()))
        worker.start()
        assert entered.wait(20)
        # Two janitors tick while the mail is being sent: neither sends again.
        assert tick_once().notified == 0 and tick_once().notified == 0
        release.set()
        worker.join(20)
    finally:
        agent.notifier = None
        release.set()
    waitpoint = WaitPoint.objects.get()
    assert waitpoint.notified_at is not None and len(tokens) == 1
    assert approve(waitpoint.approval_id, token=tokens[0]).decision == "approved"


def test_two_janitors_never_call_the_notifier_twice_for_one_wait_point(server):
    agent = registry.get("approving")
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    calls: list[str] = []
    agent.notifier = lambda run, waitpoint: (_ for _ in ()).throw(ConnectionError("down"))
    try:
        run = execute(start_run("approving", "x"))
    finally:
        agent.notifier = None
    waitpoint = WaitPoint.objects.get(run=run)
    assert waitpoint.notify_attempts == 1 and waitpoint.next_notify_at is not None
    WaitPoint.objects.filter(pk=waitpoint.pk).update(next_notify_at=Now() - timedelta(seconds=1))
    agent.notifier = lambda run, wp: calls.append(wp.token)
    try:
        barrier = threading.Barrier(2)

        def janitor() -> None:
            barrier.wait(5)
            notify(agent, Run.objects.get(pk=run.pk), WaitPoint.objects.get(pk=waitpoint.pk), resend=True)
            connection.close()

        threads = [threading.Thread(target=janitor) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    finally:
        agent.notifier = None
    assert len(calls) == 1


def test_a_failing_notifier_backs_off_longer_each_time():
    assert [store.notify_backoff(n).total_seconds() for n in (1, 2, 3, 8, 20)] == [30, 60, 120, 3600, 3600]
