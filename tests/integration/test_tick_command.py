"""``manage.py chamvi_tick`` says what it works on and what each pass did: a line when it starts, one
per pass that did something (recovered expired claims, re-queued lost jobs, expired approvals,
re-sent notifications), nothing for a quiet pass; ``--once`` prints its pass; ``-v 0`` nothing.
Against the real PostgreSQL and Redis queue; only the loop's sleep is replaced, to count passes."""

from __future__ import annotations

import io
from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from chamvi_runs import start_run, store
from chamvi_runs.agents.agent import registry
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SLEEP = "chamvi_runs.management.commands.chamvi_tick.time.sleep"


def _ago(**delta: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() - Value(timedelta(**delta)), output_field=DateTimeField())


def _expired_claim() -> Run:
    """Running, its worker gone: the lease ran out an hour ago."""
    run = start_run("basic", "x")
    assert store.claim(run.pk, "gone:1:2:3", 30)
    Run.objects.filter(pk=run.pk).update(claim_expires_at=_ago(hours=1))
    return run


def _lost_job() -> Run:
    """Queued an hour ago, and its job is in no queue (Redis lost it)."""
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(updated_at=_ago(hours=1))
    return run


def _waiting(server) -> Run:
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 5}'), finish("tool_calls"))],
    )
    run = execute(start_run("approving", "x"))
    assert run.status == "waiting"
    return run


@pytest.fixture
def due(server, queue):
    """One of each thing a pass does, due now: an expired claim, a lost job, an expired approval and
    a notification to send again (the notifier failed once, its backoff is over)."""
    _expired_claim()
    _lost_job()
    WaitPoint.objects.filter(run=_waiting(server)).update(expires_at=_ago(minutes=1))
    agent, calls = registry.get("approving"), []

    def flaky(run, waitpoint):
        calls.append(waitpoint.approval_id)
        if len(calls) == 1:
            raise ConnectionError("mail server down")

    agent.notifier = flaky
    try:
        resent = _waiting(server)
        WaitPoint.objects.filter(run=resent).update(next_notify_at=_ago(seconds=1))
        queue.empty()  # the jobs start_run enqueued: Redis lost them
        yield
    finally:
        agent.notifier = None


def _tick(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("chamvi_tick", *args, stdout=out)
    return out.getvalue().splitlines()


DID_ALL = (
    "recovered 1 expired claim(s), re-queued 1 lost job(s), expired 1 approval(s), re-sent 1 notification(s)"
)
DID_NOTHING = (
    "recovered 0 expired claim(s), re-queued 0 lost job(s), expired 0 approval(s), re-sent 0 notification(s)"
)


def test_once_prints_what_its_pass_did(due):
    assert _tick("--once") == [DID_ALL]
    assert _tick("--once") == [DID_NOTHING], "a pass with nothing due says so"


def test_verbosity_0_prints_nothing(due):
    assert _tick("--once", "-v", "0") == []
    assert WaitPoint.objects.filter(decision="expired").count() == 1, "yet the pass was made"


class Stop(Exception):
    """Ends the loop from its sleep."""


def _loop(passes: int, *args: str) -> list[str]:
    """The loop's output over ``passes`` passes."""
    out, sleeps = io.StringIO(), []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == passes:
            raise Stop

    with mock.patch(SLEEP, sleep), pytest.raises(Stop):
        call_command("chamvi_tick", "--interval", "0.5", *args, stdout=out)
    assert sleeps == [0.5] * passes
    return out.getvalue().splitlines()


def test_the_loop_says_what_it_works_on_then_only_the_passes_that_did_something(due, settings):
    database = settings.DATABASES["default"]
    lines = _loop(3)
    assert lines[0].startswith('chamvi_tick: a pass every 0.5 s on queue "chamvi", database postgresql')
    assert f'"{database["NAME"]}" on {database["HOST"]}:{database["PORT"]}' in lines[0]
    assert database["PASSWORD"] == "" or database["PASSWORD"] not in lines[0]
    assert lines[1:] == [DID_ALL], "the two quiet passes print nothing"


def test_the_loop_prints_every_pass_with_verbosity_2(db):
    assert _loop(2, "-v", "2")[1:] == [DID_NOTHING, DID_NOTHING]


def test_the_loop_prints_nothing_with_verbosity_0(due):
    assert _loop(2, "-v", "0") == []


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf"])
def test_an_interval_that_is_no_positive_number_of_seconds_is_refused(db, interval):
    with pytest.raises(CommandError, match="--interval must be a number of seconds above 0"):
        call_command("chamvi_tick", "--interval", interval)


def test_a_pass_that_fails_is_reported_and_the_loop_goes_on(due, capsys):
    """A pass that raises (the database restarting, Redis away) must not end the janitor: nothing
    would recover runs until someone restarted it."""
    real, calls = tick_once, []

    def down_once():
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the database system is starting up")
        return real()

    err = io.StringIO()
    with mock.patch("chamvi_runs.management.commands.chamvi_tick.tick_once", down_once):
        out, sleeps = io.StringIO(), []

        def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) == 2:
                raise Stop

        with mock.patch(SLEEP, sleep), pytest.raises(Stop):
            call_command("chamvi_tick", "--interval", "0.5", stdout=out, stderr=err)
    assert "the database system is starting up" in err.getvalue()
    assert out.getvalue().splitlines()[1:] == [DID_ALL], "the next pass did the work"
