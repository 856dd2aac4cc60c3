"""Runs in flight across a deploy (SPEC §14), on real PostgreSQL and Redis: a process claims only
runs of an agent version it has; a run of a version no live worker has waits, listed as stuck with
its reason; once that version has been gone for ``VERSION_GRACE_SECONDS``, ``chamvi_tick`` applies
its agent's ``on_version_change`` rule, and an operator can move or cancel it in the admin, or
apply the rules at once with ``manage.py chamvi_versions --apply``.

"A deploy" here is this process's registry seen as the new release: its agents' versions are the
current ones, a run recorded at another version is the old release's, and ``WorkerVersion`` rows
say which workers are live (the rows a worker process writes; ``test_rolling_deploy`` runs real
ones)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from chamvi_runs import VersionChange, approve, start_run, store
from chamvi_runs.agents.agent import registry
from chamvi_runs.dispatch.doorbell import waiting_jobs
from chamvi_runs.models import Run, Step, WaitPoint, WorkerVersion
from chamvi_runs.modes import mode
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.runtime.presence import Presence
from chamvi_runs.store.queries import stuck_runs
from tests.support.helpers import execute, logged_in, make_user
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

STUCK = "/admin/chamvi_runs/stuckrun/"
REFUND = json.dumps({"order_id": "o-1", "amount_cents": 500})


def _ago(**delta: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() - Value(timedelta(**delta)), output_field=DateTimeField())


def _worker(name: str, agent: str, version: str, *, gone_minutes: float | None = None) -> None:
    """A worker process's row: live, or stopped ``gone_minutes`` ago."""
    if gone_minutes is None:
        WorkerVersion.objects.create(worker=name, agent=agent, version=version, live_until=_ago(minutes=-1))
    else:
        # It started an hour before it stopped: its release came before the live ones.
        last = _ago(minutes=gone_minutes)
        WorkerVersion.objects.create(
            worker=name,
            agent=agent,
            version=version,
            started_at=_ago(minutes=gone_minutes + 60),
            seen_at=last,
            live_until=last,
            stopped_at=last,
        )


def _deployed(agent: str, *, old_gone_minutes: float | None = 10) -> str:
    """The new release's workers are live with this process's version of ``agent``; the old
    release's stopped ``old_gone_minutes`` ago (None: still live). Returns the old version."""
    _worker("new-1:1:a", agent, registry.get(agent).version)
    _worker("old-1:1:b", agent, "old", gone_minutes=old_gone_minutes)
    return "old"


def _of_old_version(run: Run) -> Run:
    Run.objects.filter(pk=run.pk).update(agent_version="old")
    return Run.objects.get(pk=run.pk)


def _grace(settings, seconds: float) -> None:
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "VERSION_GRACE_SECONDS": seconds}


def test_a_process_claims_no_run_of_a_version_it_does_not_have(server):
    run = _of_old_version(start_run("basic", "x"))
    # As an old worker would find a run a new web process started, or the other way round.
    assert execute(run).status == "queued"
    after = Run.objects.get(pk=run.pk)
    assert (after.claim_owner, after.attempt, after.started_at) == (None, 0, None)
    assert not Step.objects.filter(run=run).exists()
    # A run recorded before versions were is any worker's.
    Run.objects.filter(pk=run.pk).update(agent_version="")
    server.script("m-basic", [Reply(text("Hi."), finish("stop"))])
    assert execute(run).status == "completed"


def test_a_run_whose_version_no_live_worker_has_is_stuck_at_once_and_not_rung_again(server, settings):
    _grace(settings, 3600)
    run = _of_old_version(start_run("basic", "x"))
    # No worker is live at all: it waits for workers like any run, it is not a version's.
    assert not stuck_runs(Run.objects.filter(pk=run.pk), timedelta(minutes=10)).exists()
    _deployed("basic", old_gone_minutes=1)
    (stuck,) = stuck_runs(Run.objects.filter(pk=run.pk), timedelta(minutes=10))
    assert stuck.stuck_reason == "version"
    operator = logged_in(make_user("operator", "view_stuckrun", is_staff=True))
    page = operator.get(STUCK).content.decode()
    assert "for version old, which no live worker has" in page
    assert run.pk in operator.get(STUCK, {"reason": "version"}).content.decode()
    # Quiet for longer than a lease, its job gone (a worker dropped it), it is not rung again: no
    # worker would take it.
    mode().rq_queue.empty()
    Run.objects.filter(pk=run.pk).update(updated_at=_ago(minutes=5))
    assert tick_once().enqueued == 0
    # An old worker comes back: it is an ordinary queued run again, and the tick rings for it.
    _worker("old-2:2:c", "basic", "old")
    assert not stuck_runs(Run.objects.filter(pk=run.pk), timedelta(minutes=10)).exists()
    assert tick_once().enqueued == 1


def test_the_tick_moves_a_run_on_by_the_default_rule_once_its_version_is_gone_for_the_grace(server, settings):
    _grace(settings, 300)
    run = _of_old_version(start_run("basic", "x"))
    _deployed("basic", old_gone_minutes=1)
    # Gone for a minute of the five: it waits for an old worker that may come back.
    report = tick_once()
    assert (report.moved, report.version_failed) == (0, 0)
    assert Run.objects.get(pk=run.pk).agent_version == "old"
    WorkerVersion.objects.filter(version="old").update(
        seen_at=_ago(minutes=6), live_until=_ago(minutes=6), stopped_at=_ago(minutes=6)
    )
    report = tick_once()
    assert (report.moved, report.version_failed) == (1, 0)
    current = registry.get("basic").version
    assert Run.objects.get(pk=run.pk).agent_version == current
    assert run.pk in waiting_jobs()  # rung for the new version's workers
    server.script("m-basic", [Reply(text("Done on the new release."), finish("stop"))])
    done = execute(run)
    assert (done.status, done.output) == ("completed", "Done on the new release.")
    assert Step.objects.get(run=run, kind="llm").input["version"] == current


def test_a_version_no_worker_ever_had_is_not_gone_it_waits_for_its_workers(server, settings):
    # The new release's web process started the run before any of its workers: an old janitor (this
    # process, whose version is live) must not move it back to the old version.
    _grace(settings, 0)
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(agent_version="newer")
    _worker("old-1:1:a", "basic", registry.get("basic").version)
    assert stuck_runs(Run.objects.filter(pk=run.pk), timedelta(minutes=10)).get().stuck_reason == "version"
    assert tick_once().moved == 0
    out = StringIO()
    call_command("chamvi_versions", "--apply", stdout=out)
    assert "moved 0, failed 0" in out.getvalue()
    assert Run.objects.get(pk=run.pk).agent_version == "newer"
    # Its rows are what tell it from a gone version: they outlive the day while a run records it.
    WorkerVersion.objects.update(stopped_at=Now(), live_until=Now())
    _worker("new-1:1:b", "basic", "newer", gone_minutes=3 * 24 * 60)
    tick_once()
    assert WorkerVersion.objects.filter(version="newer").exists()
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    tick_once()
    assert not WorkerVersion.objects.filter(version="newer").exists()


def _approved_refund(server) -> Run:
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "refund o-1"))
    approve(WaitPoint.objects.get(run=run).approval_id)
    return Run.objects.get(pk=run.pk)


def _new_release_without_refund(monkeypatch) -> None:
    agent = registry.get("approving")
    monkeypatch.setattr(agent, "tools", [t for t in agent.tools if t.name != "refund"])
    monkeypatch.setattr(agent, "approvals", {})
    monkeypatch.setitem(agent.__dict__, "version", "v-without-refund")


def test_the_default_rule_fails_a_run_whose_history_called_a_tool_the_new_version_lacks(
    server, settings, monkeypatch
):
    _grace(settings, 0)
    run = _approved_refund(server)
    old = run.agent_version
    _new_release_without_refund(monkeypatch)
    _worker("new-1:1:a", "approving", "v-without-refund")
    _worker("old-1:1:b", "approving", old, gone_minutes=1)
    report = tick_once()
    assert (report.moved, report.version_failed) == (0, 1)
    failed = Run.objects.get(pk=run.pk)
    assert (failed.status, failed.error_code) == ("failed", "agent_version_gone")
    assert "has no tool 'refund'" in failed.error_message
    assert Refund.objects.count() == 0
    # Its history stays one a thread can continue: the approved call is answered, not left open.
    closed = [m for m in failed.checkpoint.history() if m["role"] == "tool"]
    assert "version it was made for is gone" in closed[-1]["content"]


def test_a_callable_rule_is_told_what_the_run_called_and_decides(server, settings, monkeypatch):
    _grace(settings, 0)
    run = _approved_refund(server)
    agent = registry.get("approving")
    asked: list[VersionChange] = []

    def keep_refunds_going(change: VersionChange) -> str:
        asked.append(change)
        return "continue"

    old = run.agent_version
    _new_release_without_refund(monkeypatch)
    monkeypatch.setattr(agent, "on_version_change", keep_refunds_going)
    _worker("new-1:1:a", "approving", "v-without-refund")
    _worker("old-1:1:b", "approving", old, gone_minutes=1)
    assert tick_once().moved == 1
    (change,) = asked
    assert (change.run.pk, change.old, change.new, change.called) == (
        run.pk,
        old,
        "v-without-refund",
        frozenset({"refund"}),
    )
    # It goes on at the new version, whose refund is gone: the approved call is a clear tool error.
    server.script("m-approving", [Reply(text("I cannot refund any more."), finish("stop"))])
    done = execute(run)
    assert (done.status, done.agent_version) == ("completed", "v-without-refund")
    assert "no tool named 'refund'" in Step.objects.get(run=run, kind="tool", name="refund").error
    assert Refund.objects.count() == 0


def test_a_rule_that_raises_or_a_version_no_worker_runs_leaves_the_run_waiting(
    server, settings, monkeypatch, caplog
):
    _grace(settings, 0)
    run = _of_old_version(start_run("basic", "x"))
    agent = registry.get("basic")

    def broken(change: VersionChange) -> str:
        raise RuntimeError("the migration has a bug")

    monkeypatch.setattr(agent, "on_version_change", broken)
    _deployed("basic", old_gone_minutes=1)
    with caplog.at_level(logging.ERROR, logger="chamvi_runs.runtime.version_moves"):
        report = tick_once()
    assert (report.moved, report.version_failed) == (0, 0)
    assert "on_version_change of agent 'basic' raised" in caplog.text
    assert Run.objects.get(pk=run.pk).agent_version == "old"
    # This process's version is not one a live worker has (its release is not deployed yet): the
    # rule is not applied here, whatever it says.
    monkeypatch.setattr(agent, "on_version_change", "fail")
    WorkerVersion.objects.filter(worker="new-1:1:a").update(version="newer")
    assert tick_once().version_failed == 0
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_an_operator_moves_a_run_to_the_current_version_or_cancels_it_in_the_admin(server):
    moved, cancelled = (_of_old_version(start_run("basic", "x")) for _ in range(2))
    _deployed("basic", old_gone_minutes=1)
    viewer = logged_in(make_user("viewer", "view_stuckrun", is_staff=True))
    page = viewer.get(STUCK).content.decode()
    assert "move_to_current_version" not in page and "cancel_runs" not in page
    operator = logged_in(make_user("operator", "view_stuckrun", "requeue_run", "cancel_run", is_staff=True))
    response = operator.post(
        STUCK, {"action": "move_to_current_version", "_selected_action": [moved.pk]}, follow=True
    )
    current = registry.get("basic").version
    assert f"Run {moved.pk} goes on at version {current}." in response.content.decode()
    assert Run.objects.get(pk=moved.pk).agent_version == current
    assert moved.pk in waiting_jobs()
    # Requeued, it would only be dropped again: the operator is told what moves it instead.
    response = operator.post(
        STUCK, {"action": "requeue_runs", "_selected_action": [cancelled.pk]}, follow=True
    )
    assert "waits for version old, which no live worker has: start a worker that has it" in (
        response.content.decode()
    )
    response = operator.post(
        STUCK, {"action": "cancel_runs", "_selected_action": [cancelled.pk]}, follow=True
    )
    assert f"Run {cancelled.pk} is cancelled." in response.content.decode()
    assert Run.objects.get(pk=cancelled.pk).status == "cancelled"


def test_chamvi_versions_lists_versions_and_applies_the_rules_at_once(server, settings):
    _grace(settings, 3600)
    run = _of_old_version(start_run("basic", "x"))
    _deployed("basic", old_gone_minutes=1)
    out = StringIO()
    call_command("chamvi_versions", stdout=out)
    listed = out.getvalue()
    current = registry.get("basic").version
    assert f"basic (this process: {current})" in listed
    assert f"  {current}: live workers; no runs in flight" in listed
    assert "  old: NO live worker; 1 queued" in listed
    out = StringIO()
    call_command("chamvi_versions", "--apply", stdout=out)
    assert f"{run.pk}: moved to the current version" in out.getvalue()
    assert Run.objects.get(pk=run.pk).agent_version == current


def test_a_process_says_which_versions_it_has_while_it_lives(settings):
    presence = Presence()
    presence.start()
    try:
        rows = WorkerVersion.objects.filter(worker=presence.name)
        assert dict(rows.values_list("agent", "version")) == registry.versions()
        assert store.live_versions()["basic"] == {registry.get("basic").version}
        # Its heartbeat keeps it live: a row whose time ran out is written again.
        rows.update(seen_at=_ago(minutes=1), live_until=_ago(minutes=1))
        assert not store.is_live("basic", registry.get("basic").version)
        wait_for(lambda: store.is_live("basic", registry.get("basic").version), 10, "a heartbeat")
        operator = logged_in(make_user("operator", "view_workerversion", is_staff=True))
        assert (
            ">live<" in operator.get("/admin/chamvi_runs/workerversion/", {"agent": "basic"}).content.decode()
        )
    finally:
        presence.stop()
    assert not store.is_live("basic", registry.get("basic").version)
    assert WorkerVersion.objects.filter(worker=presence.name, stopped_at__isnull=False).exists()
    page = operator.get("/admin/chamvi_runs/workerversion/", {"agent": "basic"}).content.decode()
    assert ">stopped<" in page and ">live<" not in page
    # A day later the rows are forgotten: nothing is decided by them any more.
    WorkerVersion.objects.update(seen_at=_ago(days=2))
    tick_once()
    assert not WorkerVersion.objects.exists()


def test_a_claim_whose_lease_ran_out_is_ended_by_the_move_and_writes_nothing_more(server, settings):
    # The last worker of the old version was cut off from the database past its lease: the run is
    # moved on, and if that worker comes back, its claim is gone (it would run the old code).
    _grace(settings, 0)
    run = _of_old_version(start_run("basic", "x"))
    held = store.claim(run.pk, "old-1:1:b:t", 30, {"basic": "old"})
    assert held is not None
    Run.objects.filter(pk=run.pk).update(claim_expires_at=_ago(seconds=1))
    _deployed("basic", old_gone_minutes=1)
    assert tick_once().moved == 1
    moved = Run.objects.get(pk=run.pk)
    assert (moved.agent_version, moved.claim_owner, moved.attempt) == (registry.get("basic").version, None, 2)
    assert not store.renew(held, 30)
    assert store.claim(run.pk, "new-1:1:a:t", 30, registry.versions()) is not None


def test_a_failing_rule_cancels_instead_a_run_whose_cancel_was_asked(server, settings, monkeypatch):
    _grace(settings, 0)
    run = _of_old_version(start_run("basic", "x"))
    assert store.claim(run.pk, "old-1:1:b:t", 30, {"basic": "old"})
    Run.objects.filter(pk=run.pk).update(claim_expires_at=_ago(seconds=1), cancel_requested=True)
    monkeypatch.setattr(registry.get("basic"), "on_version_change", "fail")
    _deployed("basic", old_gone_minutes=1)
    report = tick_once()
    assert (report.moved, report.version_failed) == (0, 0)
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_older_code_never_moves_a_newer_versions_runs_but_an_operator_may(server, settings):
    # The new release's workers crashed (or it was rolled back): this process, of the release before
    # it, leaves its runs alone, whatever the grace; an operator moves them back explicitly.
    _grace(settings, 0)
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(agent_version="newer")
    current = registry.get("basic").version
    WorkerVersion.objects.create(
        worker="old-1:1:a",
        agent="basic",
        version=current,
        started_at=_ago(hours=3),
        live_until=_ago(minutes=-1),
    )
    _worker("new-1:1:b", "basic", "newer", gone_minutes=30)  # started after the live one
    assert tick_once().moved == 0
    assert Run.objects.get(pk=run.pk).agent_version == "newer"
    operator = logged_in(make_user("operator", "view_stuckrun", "requeue_run", is_staff=True))
    response = operator.post(
        STUCK, {"action": "move_to_current_version", "_selected_action": [run.pk]}, follow=True
    )
    assert f"Run {run.pk} goes on at version {current}." in response.content.decode()


def test_the_admin_moves_only_runs_waiting_for_a_version_and_only_to_one_a_worker_has(server):
    queued = start_run("basic", "x")  # queued too long, with its version's workers live
    Run.objects.filter(pk=queued.pk).update(created_at=_ago(hours=1), agent_version="another")
    waiting = _of_old_version(start_run("basic", "y"))
    WorkerVersion.objects.create(
        worker="w:1:a", agent="basic", version="another", live_until=_ago(minutes=-1)
    )
    operator = logged_in(make_user("operator", "view_stuckrun", "requeue_run", is_staff=True))
    page = operator.post(
        STUCK, {"action": "move_to_current_version", "_selected_action": [queued.pk, waiting.pk]}, follow=True
    ).content.decode()
    assert f"Run {queued.pk} is not waiting for a version: skipped." in page
    assert f"Run {waiting.pk} stays: no live worker has version {registry.get('basic').version}" in page
    assert Run.objects.get(pk=waiting.pk).agent_version == "old"


def test_a_process_that_starts_rings_for_the_ready_runs_of_its_versions(server):
    # Started by a web process of its release before any of its workers: their jobs were dropped.
    run = start_run("basic", "x")
    mode().rq_queue.empty()
    presence = Presence()
    presence.start()
    try:
        assert run.pk in waiting_jobs()
        # Stopped and started again (a worker's work() after a drain), it says so again.
        presence.stop()
        presence.start()
        WorkerVersion.objects.filter(worker=presence.name).update(live_until=_ago(minutes=1))
        wait_for(lambda: store.is_live("basic", registry.get("basic").version), 10, "a heartbeat")
    finally:
        presence.stop()
