"""A worker SIGKILLed at each named point of an execution: the run is recovered, nothing twice."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from chamvi_runs import store
from chamvi_runs.models import Run
from tests.support.processes import ROOT, wait_for, worker_env
from tests.system.faults.conftest import CONCURRENT
from tests.system.faults.harness import check, held_by, recover, start_tagged

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

POINTS = [
    "after_claim",
    "mid_stream",
    "before_step_commit",
    "after_step_commit",
    "after_effect_record",
    "before_settle",
]


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_a_named_point_is_recovered(point, model, pool):
    doomed = pool.spawn(crash_at=point)
    runs = start_tagged(3)
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash at {point}"
    recover(runs.values(), pool)
    crashed = next(tag for tag, run_id in runs.items() if Run.objects.get(pk=run_id).attempt > 1)
    report = check(runs, model, pool, faults=Counter({crashed: 1}))
    assert report.completed == 3
    assert report.effects_applied == 3


@pytest.mark.parametrize("concurrency", [CONCURRENT], ids=[f"concurrency{CONCURRENT}"])
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_a_named_point_takes_its_sibling_executions_and_all_are_recovered(point, model, pool):
    """The process dies at ``point`` while its other threads execute runs too: every run it held
    is recovered from its own checkpoint, and nothing happens twice."""
    model.pause = 1.0  # each held run reaches its next point about a second after its claim
    # A point whose marker exists is disarmed: the worker first takes all but one of its threads'
    # runs, then the point is armed and one more run sent (so after_claim is reached again).
    marker = pool.marker / point
    marker.touch()
    doomed = pool.spawn(crash_at=point)
    runs = start_tagged(CONCURRENT - 1)
    wait_for(lambda: len(held_by(doomed.pid)) == CONCURRENT - 1, 30, doomed.output)
    marker.unlink()
    runs.update(start_tagged(1))
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash at {point}"
    held = {run.pk for run in held_by(doomed.pid)}  # exact: the dead process released nothing
    assert len(held) >= 2, f"the worker held {len(held)} runs when it crashed at {point}"
    recover(runs.values(), pool)
    report = check(runs, model, pool, faults=Counter(tag for tag, run_id in runs.items() if run_id in held))
    assert report.completed == CONCURRENT
    assert report.effects_applied == CONCURRENT


def test_a_web_process_that_dies_before_enqueueing_leaves_a_run_the_janitor_finds(model, pool, server):
    script = "from chamvi_runs import start_run; start_run('faulty', {'tag': 'lost-doorbell'})"
    env = worker_env(server.base_url, CHAMVI_CRASH_AT="before_enqueue")
    web = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert web.returncode == -9, web.stderr.decode()[-2000:]
    run = Run.objects.get(trigger__payload__tag="lost-doorbell")
    assert run.status == "queued"
    pool.spawn()
    recover([run.pk], pool)
    check({"lost-doorbell": run.pk}, model, pool)


def test_a_job_enqueued_before_its_transaction_commits_finds_nothing_then_the_janitor_recovers(model, pool):
    import django_rq
    from django.db import transaction
    from rq import Queue
    from rq.serializers import JSONSerializer

    worker = pool.spawn()
    # A plain RQ queue: django-rq's would defer the job to on_commit, as chamvi_runs does.
    raw = Queue("chamvi", connection=django_rq.get_connection("chamvi"), serializer=JSONSerializer)
    with transaction.atomic():
        envelope = {
            "source": "api",
            "trigger": "api",
            "payload": {"tag": "early"},
            "keys": {},
            "attachments": [],
        }
        run_id = store.create_run(agent="faulty", trigger=envelope)[0].pk
        runs = {"early": run_id}
        raw.enqueue("chamvi_runs.jobs.execute_run", run_id)
        wait_for(lambda: "Job OK" in worker.output(), 30, worker.output)
    assert Run.objects.get(pk=run_id).status == "queued"
    recover(runs.values(), pool)
    check(runs, model, pool)
