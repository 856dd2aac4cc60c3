"""The admin's "Stuck runs": which runs it lists and why, and its requeue action, which does for a
stuck run what ``chamvi_tick`` would (a doorbell, or the expiry of its approval) and nothing else."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.test import Client

from chamvi_runs import cancel_run, start_run, store
from chamvi_runs.models import Run, StuckRun, WaitPoint
from tests.support.helpers import admin_url, execute, logged_in, make_user
from tests.support.processes import WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

STUCK = "/admin/chamvi_runs/stuckrun/"
OWNER = "web-7:4242:139807:9f2c1a"


def _ago(**delta: float) -> ExpressionWrapper:
    """A time in the past by the database's clock, which is the one the admin reads."""
    return ExpressionWrapper(Now() - Value(timedelta(**delta)), output_field=DateTimeField())


def _held(run: Run, lease_seconds: float = 30) -> Run:
    assert store.claim(run.pk, OWNER, lease_seconds)
    return Run.objects.get(pk=run.pk)


def _lease_expired(minutes: float = 3) -> Run:
    """Running, its worker gone: the lease ran out ``minutes`` ago."""
    run = _held(start_run("basic", "x"))
    Run.objects.filter(pk=run.pk).update(claim_expires_at=_ago(minutes=minutes))
    return run


def _queued_for(minutes: float, **options: str) -> Run:
    run = start_run("basic", "x", **options)
    Run.objects.filter(pk=run.pk).update(created_at=_ago(minutes=minutes))
    return run


def _waiting(server, agent: str = "approving", expired_hours: float | None = None) -> Run:
    server.script(
        f"m-{agent}",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 5}'), finish("tool_calls"))],
    )
    run = execute(start_run(agent, "x"))
    assert run.status == "waiting"
    if expired_hours is not None:
        WaitPoint.objects.filter(run=run).update(expires_at=_ago(hours=expired_hours))
    return run


def _requeuer() -> Client:
    return logged_in(make_user("operator", "view_stuckrun", "requeue_run", is_staff=True))


def _requeue(client: Client, *runs: Run) -> list[str]:
    """Post the requeue action for ``runs``; the messages the user sees."""
    response = client.post(
        STUCK, {"action": "requeue_runs", "_selected_action": [r.pk for r in runs]}, follow=True
    )
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def _rows(page: str) -> dict[str, str]:
    """Run id -> the text of its row, as the changelist shows it."""
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    listed = {}
    for row in rows:
        ids = re.findall(r'name="_selected_action" value="([^"]+)"', row)
        if ids:
            listed[ids[0]] = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip()
    return listed


def test_each_kind_of_stuck_run_is_listed_with_why_and_healthy_runs_are_not(server, root_client):
    lease = _lease_expired(minutes=3)
    queued = _queued_for(25)
    approval = _waiting(server, expired_hours=2)

    live = _held(start_run("basic", "x"))
    fresh = start_run("basic", "x")
    time_left = _waiting(server)
    settled = _queued_for(60)
    cancel_run(settled.pk)
    # Behind a running elder of its concurrency key: the elder's settle admits it, nothing is stuck.
    elder = _held(_queued_for(40, concurrency_key="k"))
    behind = _queued_for(30, concurrency_key="k")

    page = root_client.get(STUCK)
    assert page.status_code == 200
    rows = _rows(page.content.decode())
    assert set(rows) == {lease.pk, queued.pk, approval.pk}, "healthy runs are not listed"
    assert "lease expired 3 min ago (worker web-7:4242)" in rows[lease.pk]
    assert f"basic lease expired 3 min ago (worker web-7:4242) 1 {OWNER}" in rows[lease.pk]
    assert "queued 25 min" in rows[queued.pk]
    assert "approval expired 2 h ago" in rows[approval.pk]
    for healthy in (live, fresh, time_left, settled, elder, behind):
        assert healthy.pk not in page.content.decode()

    by_reason = {
        reason: set(_rows(root_client.get(STUCK, {"reason": reason}).content.decode()))
        for reason in ("lease_expired", "queued", "approval_expired")
    }
    assert by_reason == {
        "lease_expired": {lease.pk},
        "queued": {queued.pk},
        "approval_expired": {approval.pk},
    }


def test_the_changelist_renders_with_the_admins_styles_and_is_read_only(root_client):
    stuck = _queued_for(25)
    index = root_client.get("/admin/chamvi_runs/")
    assert index.status_code == 200 and "Stuck runs" in index.content.decode()

    page = root_client.get(STUCK)
    assert page.status_code == 200
    html = page.content.decode()
    stylesheets = re.findall(r'<link rel="stylesheet" href="/static/([^"]+)"', html)
    assert "admin/css/base.css" in stylesheets and "admin/css/changelists.css" in stylesheets
    assert all(finders.find(sheet) for sheet in stylesheets), "every stylesheet the page links exists"
    assert "Select stuck run to view" in html
    assert 'value="delete_selected"' not in html and f"{STUCK}add/" not in html
    # The id leads to the run's own page, with its steps and wait points.
    assert f'href="{admin_url(stuck)}"' in html

    before = list(Run.objects.values())
    change = admin_url(StuckRun.objects.get(pk=stuck.pk))
    form = root_client.get(change)
    assert form.status_code == 200 and b'name="_save"' not in form.content
    assert root_client.post(change, {"status": "completed", "_save": "Save"}).status_code == 403
    assert root_client.get(f"{STUCK}add/").status_code == 403
    delete = admin_url(StuckRun.objects.get(pk=stuck.pk), "delete")
    assert root_client.post(delete, {"post": "yes"}).status_code == 403
    assert list(Run.objects.values()) == before


def test_requeue_of_an_expired_lease_lets_a_real_worker_finish_the_run(server, queue):
    server.script("m-basic", [Reply(text("recovered"), finish("stop"))])
    run = _lease_expired()
    # Its job went with the dead worker, or with a Redis that lost its data.
    queue.empty()

    assert _requeue(_requeuer(), run) == [f"{run.pk} is on the queue again: a worker will claim it."]
    assert [job.args for job in queue.get_jobs()] == [[run.pk]]

    worker = WorkerProcess(worker_env(server.base_url))
    try:
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status == "completed",
            30,
            lambda: "the requeued run to complete\n" + worker.output(),
        )
    finally:
        worker.stop()
    run.refresh_from_db()
    assert run.output == "recovered" and run.attempt == 2 and run.claim_owner is None


@pytest.mark.parametrize(("agent", "status"), [("approving", "running"), ("expiring_fail", "failed")])
def test_requeue_of_an_expired_approval_expires_it_as_the_tick_does(server, queue, agent, status):
    run = _waiting(server, agent, expired_hours=2)
    queue.empty()

    assert _requeue(_requeuer(), run) == [f"{run.pk}: its approval expired; the run is {status} now."]
    assert WaitPoint.objects.get(run=run).decision == "expired"
    run.refresh_from_db()
    assert run.status == status
    if status == "failed":
        assert run.error_code == "approval_expired" and not queue.get_job_ids()
        return
    assert [job.args for job in queue.get_jobs()] == [[run.pk]]
    server.script(f"m-{agent}", [Reply(text("Expired, sorry."), finish("stop"))])
    assert execute(run).status == "completed"


def test_requeue_skips_runs_that_are_not_stuck_and_rings_no_second_doorbell(server, queue):
    stuck = _queued_for(25)  # its job from start_run still waits: no worker took it
    fresh = start_run("basic", "x")
    live = _held(start_run("basic", "x"))
    jobs = sorted(queue.get_job_ids())
    before = list(Run.objects.order_by("pk").values())
    client = _requeuer()

    assert sorted(_requeue(client, stuck, fresh, live)) == sorted(
        [
            f"{fresh.pk} is no longer stuck: skipped.",
            f"{live.pk} is no longer stuck: skipped.",
            f"{stuck.pk} already has a job waiting in the queue: are workers running, or all busy?",
        ]
    )
    assert sorted(queue.get_job_ids()) == jobs
    assert list(Run.objects.order_by("pk").values()) == before

    queue.empty()
    assert _requeue(client, stuck) == [f"{stuck.pk} is on the queue again: a worker will claim it."]
    assert [job.args for job in queue.get_jobs()] == [[stuck.pk]]


def test_the_requeue_action_needs_the_requeue_permission(queue):
    stuck = _queued_for(25)
    queue.empty()
    viewer = logged_in(make_user("viewer", "view_stuckrun", "view_run", "cancel_run", is_staff=True))
    page = viewer.get(STUCK)
    assert page.status_code == 200 and stuck.pk in page.content.decode()
    assert 'value="requeue_runs"' not in page.content.decode()
    viewer.post(STUCK, {"action": "requeue_runs", "_selected_action": [stuck.pk]})
    assert not queue.get_job_ids()

    assert 'value="requeue_runs"' in _requeuer().get(STUCK).content.decode()


def test_a_parent_waiting_on_a_stuck_child_is_listed_with_the_child(server, root_client):
    """The child's worker died (its lease expired): the child is stuck, and so is the parent that
    waits for it, which says which child; a parent whose child is healthy is not listed."""
    server.script(
        "m-triage",
        [Reply(tool_call(f"c{n}", "billing", '{"task": "refund"}'), finish("tool_calls")) for n in range(2)],
    )
    stuck_parent = execute(start_run("triage", "x"))
    healthy_parent = execute(start_run("triage", "y"))
    (dead,) = Run.objects.filter(parent=stuck_parent)
    (alive,) = Run.objects.filter(parent=healthy_parent)
    dead = _held(dead)
    Run.objects.filter(pk=dead.pk).update(claim_expires_at=_ago(minutes=5))
    _held(alive)

    rows = _rows(root_client.get(STUCK).content.decode())
    assert set(rows) == {dead.pk, stuck_parent.pk}
    assert "lease expired 5 min ago" in rows[dead.pk]
    assert f"for child run {dead.pk}, which is stuck" in rows[stuck_parent.pk]
    assert set(_rows(root_client.get(STUCK, {"reason": "child_stuck"}).content.decode())) == {stuck_parent.pk}
    for run in Run.objects.exclude(status__in=["completed", "failed", "cancelled"]):
        cancel_run(run.pk)


def test_requeue_of_a_parent_stuck_on_its_child_requeues_the_child(server, queue):
    server.script("m-triage", [Reply(tool_call("c1", "billing", '{"task": "refund"}'), finish("tool_calls"))])
    parent = execute(start_run("triage", "x"))
    (child,) = Run.objects.filter(parent=parent)
    Run.objects.filter(pk=child.pk).update(created_at=_ago(minutes=30))
    queue.empty()
    said = _requeue(_requeuer(), Run.objects.get(pk=parent.pk))
    assert said == [f"{child.pk} is on the queue again: a worker will claim it."]
    assert [job.args for job in queue.get_jobs()] == [[child.pk]]
    cancel_run(parent.pk)
