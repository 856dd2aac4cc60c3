"""The database's clock decides: approval expiry on a host whose clock is skewed, the order runs of a
concurrency key start in, and an approve racing a cancel never deadlocks."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from chamvi_runs import approve, cancel_run, start_run, store
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


@pytest.fixture
def skewed_host(monkeypatch):
    """This host's clock runs an hour ahead of the database's (and of the other hosts')."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(hours=1))


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_approval_expiry_is_decided_by_the_database_clock(server, skewed_host):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))  # approval_ttl = 5 minutes
    waitpoint = WaitPoint.objects.get(run=run)
    assert abs((waitpoint.expires_at - _db_now()) - timedelta(minutes=5)) < timedelta(seconds=30)
    # Not expired by the database's clock, though this host's clock is past it: the approval stands.
    assert tick_once().expired == 0
    assert approve(waitpoint.approval_id).decision == "approved"


def test_runs_of_a_key_start_in_the_order_the_database_saw_them(monkeypatch):
    first = start_run("basic", "x", concurrency_key="k")
    real = timezone.now
    # The second comes from a host whose clock is an hour behind.
    monkeypatch.setattr(timezone, "now", lambda: real() - timedelta(hours=1))
    second = start_run("basic", "y", concurrency_key="k")
    first, second = Run.objects.get(pk=first.pk), Run.objects.get(pk=second.pk)
    assert first.created_at < second.created_at
    assert store.claim(second.pk, "w", 30) is None, "the elder goes first"
    assert store.claim(first.pk, "w", 30) is not None


def test_a_concurrent_approve_and_cancel_never_deadlock(server):
    for n in range(6):
        server.script("m-approving", [Reply(tool_call(f"c{n}", "refund", REFUND), finish("tool_calls"))])
    runs = [execute(start_run("approving", str(n))) for n in range(6)]
    errors: list[BaseException] = []

    def attempt(action) -> None:
        try:
            action()
        except BaseException as exc:
            if type(exc).__name__ not in ("DecisionRefused",):
                errors.append(exc)
        finally:
            connection.close()

    for run in runs:
        approval = WaitPoint.objects.get(run=run).approval_id
        barrier = threading.Barrier(2)
        pair = [
            threading.Thread(target=attempt, args=(lambda a=approval, b=barrier: (b.wait(5), approve(a)),)),
            threading.Thread(target=attempt, args=(lambda r=run.pk, b=barrier: (b.wait(5), cancel_run(r)),)),
        ]
        for t in pair:
            t.start()
        for t in pair:
            t.join(20)
    assert errors == []
    for run in runs:
        run.refresh_from_db()
        decision = WaitPoint.objects.get(run=run).decision
        # One of the two won, cleanly: approved and re-queued, or cancelled with the approval closed.
        assert (run.status, decision) in (
            ("running", "approved"),  # approved; the cancel found it held or lost to it
            ("cancelled", "approved"),  # approved, then cancelled before a worker took it
            ("cancelled", "cancelled"),  # cancelled while waiting: the approval closed with it
        )
