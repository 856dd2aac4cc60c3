"""Two sites whose workers listen on one Redis queue (both left at the default name, ``chamvi``):
each site's jobs are executed by its own workers, a worker puts the other site's jobs back on the
queue untouched and says why once, and old and pruned jobs stay what they were.

Site A is the test database; site B a database of its own, migrated for the test. Each has a real
``manage.py rqworker chamvi`` process, and both use this run's Redis."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from chamvi_runs import start_run
from chamvi_runs.models import Run
from chamvi_runs.modes import EXECUTE_RUN
from tests.support.processes import ROOT, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ANOTHER_SITE = "was enqueued by another site"


def _url(database: str, host: str | None = None) -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{host or db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{database}"


@pytest.fixture
def site_b() -> Iterator[str]:
    """The DATABASE_URL of a second site: a migrated database of its own."""
    name = f"{connection.settings_dict['NAME']}_site_b"
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _url(name)
    _manage(url, "migrate", "--no-input")
    yield url
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _manage(database_url: str, *args: str) -> str:
    env = worker_env("http://127.0.0.1:9/v1")
    env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _status_in(database_url: str, run_id: str) -> str | None:
    with psycopg.connect(database_url) as db:
        row = db.execute("SELECT status FROM chamvi_runs_run WHERE id = %s", [run_id]).fetchone()
    return row[0] if row else None


@pytest.fixture
def spawn(server) -> Iterator:
    workers: list[WorkerProcess] = []

    def start(database_url: str | None = None, *args: str) -> WorkerProcess:
        env = worker_env(server.base_url)
        if database_url:
            env["DATABASE_URL"] = database_url
        worker = WorkerProcess(env, *args)
        workers.append(worker)
        wait_for(worker.ready, 30, worker.output)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def _answers(server, n: int) -> None:
    server.script("m-basic", [Reply(text("42"), finish("stop")) for _ in range(n)])


def test_each_site_runs_its_own_jobs_and_puts_the_others_back(server, spawn, queue, site_b):
    _answers(server, 2)
    worker_b = spawn(site_b)
    run_a = start_run("basic", {"q": "site A"})
    # B's worker takes A's job first (no other worker listens): it must not swallow it.
    wait_for(lambda: ANOTHER_SITE in worker_b.output(), 30, worker_b.output)
    # Back in the queue, untouched (B's worker takes it again now and then, and puts it back at once).
    [job_id] = wait_for(lambda: queue.get_job_ids(), 10, "A's job back in the queue")
    assert job_id.endswith(run_a.pk) and queue.fetch_job(job_id).get_status() == "queued"
    assert Run.objects.get(pk=run_a.pk).status == "queued"
    assert f"database {connection.settings_dict['NAME']!r}" in worker_b.output()
    assert 'CHAMVI_RUNS["QUEUE"]' in worker_b.output()

    worker_a = spawn()
    wait_for(lambda: Run.objects.get(pk=run_a.pk).status == "completed", 30, worker_a.output)
    assert not queue.get_job_ids()

    # And the other way round: B's run, while only A's worker listens, then with B's too.
    worker_b.stop()
    start_b = "from chamvi_runs import start_run; print(start_run('basic', 'b').pk)"
    run_b = _manage(site_b, "shell", "-c", start_b).splitlines()[-1]
    wait_for(lambda: ANOTHER_SITE in worker_a.output(), 30, worker_a.output)
    assert _status_in(site_b, run_b) == "queued"
    spawn(site_b)
    wait_for(lambda: _status_in(site_b, run_b) == "completed", 30, worker_a.output)
    # A's worker saw B's job more than once while it waited, and said so once.
    assert worker_a.output().count(ANOTHER_SITE) == 1, worker_a.output()
    assert not Run.objects.filter(pk=run_b).exists()


def test_unstamped_jobs_run_pruned_runs_are_dropped_and_a_burst_leaves_foreign_jobs(server, spawn, queue):
    from chamvi_runs.dispatch import sites

    _answers(server, 1)
    run = start_run("basic", {"q": "enqueued by the previous release"})
    queue.empty()

    def enqueue(run_id: str, meta: dict | None) -> str:
        job_id = f"chamvi-test-{run_id}"
        queue.enqueue(EXECUTE_RUN.path, run_id, job_id=job_id, job_timeout=-1, result_ttl=0, meta=meta)
        return job_id

    enqueue(run.pk, None)  # a rolling upgrade: the job of a release without stamps
    enqueue(str(uuid.uuid4()), sites.stamp())  # this site's job, whose run was pruned meanwhile
    foreign = enqueue(str(uuid.uuid4()), {sites.SITE: "0" * 16, sites.DATABASE: "othersite"})

    worker = spawn(None, "--burst")
    assert worker.wait(30) == 0, worker.output()
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert queue.get_job_ids() == [foreign]
    assert queue.fetch_job(foreign).get_status() == "queued"
    output = worker.output()
    assert output.count(ANOTHER_SITE) == 1 and "database 'othersite'" in output, output


PRINT_FINGERPRINT = "from chamvi_runs.dispatch.sites import fingerprint; print(fingerprint())"


def test_a_site_is_the_same_whatever_host_name_reaches_its_database():
    from chamvi_runs.dispatch import sites

    here = sites.fingerprint()
    for host in ("127.0.0.1", "localhost"):
        database_url = _url(connection.settings_dict["NAME"], host)
        printed = _manage(database_url, "shell", "-c", PRINT_FINGERPRINT)
        assert printed.splitlines()[-1] == here, host
