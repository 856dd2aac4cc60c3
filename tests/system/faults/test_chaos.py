"""Random and systemic faults with several real worker processes on PostgreSQL and Redis."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from chamvi_runs import cancel_run
from chamvi_runs.dispatch.doorbell import _enqueue_now
from chamvi_runs.models import Run
from chamvi_runs.streaming.broadcast import event_log
from tests.support.helpers import expire_lease, make_superuser
from tests.support.processes import ROOT, WebProcess, wait_for, worker_env
from tests.system.faults.conftest import CONCURRENT, SCALE, each_concurrency
from tests.system.faults.harness import check, held_by, recover, start_tagged

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def restarts_services(test):
    """Restarts PostgreSQL or Redis: skipped unless asked for, and run alone (tests/lanes.py)."""
    skip = pytest.mark.skipif(
        not (os.environ.get("CI") or os.environ.get("CHAMVI_RESTART_SERVICES"))
        or not shutil.which("pg_ctlcluster"),
        reason="restarts PostgreSQL/Redis: set CHAMVI_RESTART_SERVICES=1 (CI=true does) on a machine you own",
    )
    return pytest.mark.alone(skip(test))


def _scenario(name: str, concurrency: int) -> str:
    return name if concurrency == 1 else f"{name}, {concurrency} runs per worker"


def _tags(runs: dict[str, str]) -> dict[str, str]:
    return {run_id: tag for tag, run_id in runs.items()}


def _signal_in_batches(
    pool, batches: int, runs_per_batch: int, signals_per_batch: int, sig: int
) -> tuple[dict[str, str], Counter[str], list[int]]:
    """Start batches of runs and send ``sig`` to a random worker at random moments; every run
    a victim held at that moment counts one fault. Returns the runs, the faults and, per signal,
    how many runs its victim held."""
    all_runs: dict[str, str] = {}
    faults: Counter[str] = Counter()
    hits: list[int] = []
    for _ in range(batches):
        pool.ensure(2)
        runs = start_tagged(runs_per_batch)
        by_id = _tags(runs)
        for _ in range(signals_per_batch):
            pool.ensure(2)
            victim = random.choice(pool.alive())
            # Before RQ installs its handlers, SIGTERM simply ends the process (no run held yet).
            wait_for(victim.ready, 30, victim.output)
            time.sleep(random.uniform(0.05, 1.0))
            held = held_by(victim.pid)
            victim.signal(sig)
            try:
                code = victim.wait(20)
            except subprocess.TimeoutExpired:
                output = victim.output()[-6000:]
                raise AssertionError(f"worker still up 20 s after {sig!r}:\n{output}") from None
            if sig == signal.SIGTERM:
                assert code == 0, victim.output()[-3000:]
            else:
                # What a killed process holds is exact once it is dead: a run it claimed between
                # the read above and the signal (likelier with several threads claiming) counts,
                # one it settled in between does not.
                held = held_by(victim.pid)
            hits.append(len(held))
            for run in held:
                faults[by_id.get(run.pk, "?")] += 1
        recover(runs.values(), pool)
        all_runs.update(runs)
    return all_runs, faults, hits


def _took_several(hits: list[int], concurrency: int) -> None:
    """A concurrent variant proves something only if a signal hit a process of several runs."""
    if concurrency > 1:
        assert max(hits) >= 2, f"no signalled worker held more than one run: {hits}"


# concurrency -> (batches, runs per batch). Two workers of CONCURRENT threads hold up to 8 runs:
# 10 per batch fill both, so a kill takes several executions at once and leaves queued runs to
# the replacement worker; half the batches keep the variant's cost near the serial one's.
SIGKILL_SIZES = {1: (10, 5), CONCURRENT: (5, 10)}


@each_concurrency
def test_random_sigkills_lose_nothing_and_repeat_at_most_the_step_in_flight(concurrency, model, pool, record):
    batches, per_batch = SIGKILL_SIZES[concurrency]
    runs, faults, hits = _signal_in_batches(pool, batches * SCALE, per_batch, 2, signal.SIGKILL)
    report = check(runs, model, pool, faults)
    record(
        _scenario("random SIGKILL", concurrency),
        report,
        kills=len(hits),
        runs_hit=sum(faults.values()),
        most_per_kill=max(hits),
    )
    assert report.completed == len(runs)
    _took_several(hits, concurrency)


def test_recovery_time_after_a_sigkill_with_test_lease_settings(model, pool, server, record):
    """No time travel here: the lease (4 s in tests) runs out and a real chamvi_tick loop acts."""
    tick = subprocess.Popen(
        [
            ".venv/bin/python" if Path(ROOT, ".venv/bin/python").exists() else "python",
            "manage.py",
            "chamvi_tick",
            "--interval",
            "0.5",
        ],
        cwd=ROOT,
        env=worker_env(server.base_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    model.pause = 1.0
    claimed_again, settled = [], []
    runs_all: dict[str, str] = {}
    faults: Counter[str] = Counter()
    try:
        for _ in range(3 * SCALE):
            victim = pool.spawn()
            pool.ensure(2)
            runs = start_tagged(1)
            (run_id,) = runs.values()
            wait_for(
                lambda run_id=run_id: Run.objects.filter(pk=run_id, claim_owner__isnull=False).exists(),
                30,
                "a claim",
            )
            run = Run.objects.get(pk=run_id)
            owner_pid = int(run.claim_owner.split(":")[1])
            target = next(w for w in pool.alive() if w.pid == owner_pid)
            time.sleep(0.3)
            target.signal(signal.SIGKILL)
            target.wait(10)
            killed_at = time.monotonic()
            faults[next(iter(runs))] += 1
            wait_for(
                lambda run_id=run_id, a=run.attempt: Run.objects.get(pk=run_id).attempt > a, 60, "a re-claim"
            )
            claimed_again.append(time.monotonic() - killed_at)
            wait_for(lambda run_id=run_id: Run.objects.get(pk=run_id).status == "completed", 60, "completion")
            settled.append(time.monotonic() - killed_at)
            runs_all.update(runs)
            del victim
    finally:
        tick.terminate()
        tick.wait(10)
    report = check(runs_all, model, pool, faults)
    record(
        "recovery after SIGKILL (lease 4 s, heartbeat 1 s, tick every 0.5 s)",
        report,
        reclaim_median_s=round(statistics.median(claimed_again), 2),
        reclaim_max_s=round(max(claimed_again), 2),
        complete_median_s=round(statistics.median(settled), 2),
        complete_max_s=round(max(settled), 2),
    )


def test_a_frozen_worker_that_wakes_after_its_lease_writes_nothing(model, pool, record):
    model.pause = 3.0
    frozen = pool.spawn()
    runs = start_tagged(1)
    ((tag, run_id),) = runs.items()
    wait_for(
        lambda: frozen.pid in [int(r.claim_owner.split(":")[1]) for r in held_by(frozen.pid)], 30, "claim"
    )
    time.sleep(0.5)
    frozen.signal(signal.SIGSTOP)
    try:
        expire_lease(run_id)
        model.pause = 0.05
        pool.spawn()
        from chamvi_runs.runtime.janitor import tick_once

        tick_once()
        wait_for(lambda: Run.objects.get(pk=run_id).status == "completed", 60, "the rescuer to complete")
    finally:
        frozen.signal(signal.SIGCONT)
    wait_for(
        lambda: "LeaseLostError" in frozen.output() or "lease lost" in frozen.output(), 30, frozen.output
    )
    time.sleep(1.0)
    report = check(runs, model, pool, Counter({tag: 1}))
    record("SIGSTOP past the lease, then SIGCONT", report)
    assert frozen.proc.poll() is None, "the woken worker goes on serving"


# With CONCURRENT threads per worker, duplicate jobs of one run also meet in one process.
RACING_RUNS = {1: 3, CONCURRENT: 8}


@each_concurrency
def test_many_workers_racing_for_one_run_execute_it_once(concurrency, model, pool, record):
    for _ in range(4):
        pool.spawn()
    runs = start_tagged(RACING_RUNS[concurrency] * SCALE)
    for run_id in runs.values():
        for _ in range(5):
            _enqueue_now(run_id)
    recover(runs.values(), pool, workers=4)
    report = check(runs, model, pool)
    assert report.model_calls == report.llm_steps, "a duplicate job made a model call"
    record(_scenario("4 workers, 6 jobs per run", concurrency), report)


@each_concurrency
def test_a_concurrency_key_admits_one_run_at_a_time_in_creation_order_across_workers(
    concurrency, model, pool, record
):
    model.pause = 0.05
    for _ in range(4):
        pool.spawn()
    runs = start_tagged(8 * SCALE, concurrency_key="tenant-7")
    recover(runs.values(), pool, workers=4, timeout=120)
    report = check(runs, model, pool)
    ordered = list(Run.objects.filter(pk__in=runs.values()).order_by("created_at", "id"))
    for elder, younger in itertools.pairwise(ordered):
        assert elder.finished_at <= younger.started_at, (
            "two runs of one key executed at once, or out of order"
        )
    record(_scenario("concurrency key across 4 workers", concurrency), report)


def test_cancel_racing_completion_ends_in_one_status_that_the_final_event_tells(model, pool, record):
    model.pause = 0.1
    pool.ensure(2)
    # Workers that are still starting would leave every cancel landing on a queued run.
    wait_for(lambda: all(w.ready() for w in pool.alive()), 30, "the workers to listen")
    runs = start_tagged(10 * SCALE)
    started = time.monotonic()
    # Each run is cancelled at its own random moment: before, during or after its execution.
    schedule = sorted((random.uniform(0, 1.8 * SCALE), run_id) for run_id in runs.values())
    for at, run_id in schedule:
        time.sleep(max(0.0, at - (time.monotonic() - started)))
        cancel_run(run_id)
    recover(runs.values(), pool)
    # A cancel aborts the model call in flight: one call per run may have no step.
    report = check(runs, model, pool, Counter(runs.keys()), allowed=("completed", "cancelled"))
    for run_id in runs.values():
        run = Run.objects.get(pk=run_id)
        ends = [e for e in event_log().after(run_id, 0) if e["type"] == "run.end"]
        assert [e["status"] for e in ends] == [run.status], f"{run_id}: events {ends} vs {run.status}"
    record("cancel racing completion", report, cancelled=report.cancelled)


# concurrency -> (batches, runs per batch): 12 runs keep two workers of CONCURRENT threads full
# for about two seconds, so a drain at a random moment settles several executions at once.
DRAIN_SIZES = {1: (4, 3), CONCURRENT: (4, 12)}


@each_concurrency
def test_drain_at_random_moments_loses_nothing(concurrency, model, pool, record):
    batches, per_batch = DRAIN_SIZES[concurrency]
    runs, faults, hits = _signal_in_batches(pool, batches * SCALE, per_batch, 1, signal.SIGTERM)
    report = check(runs, model, pool, faults)
    record(_scenario("SIGTERM drain", concurrency), report, drains=len(hits), most_per_drain=max(hits))
    _took_several(hits, concurrency)


@pytest.fixture
def web(server):
    from chamvi_runs.web.auth import create_token

    user = make_superuser("ops")
    process = WebProcess(worker_env(server.base_url))
    process.token = create_token(user, "faults")[1]
    yield process
    process.stop()


def _web_starts_and_reads_a_run(web) -> dict[str, str]:
    tag = f"web-{random.getrandbits(32):x}"
    status, body = web.request(
        "POST", "/chamvi/api/runs/", web.token, {"agent": "faulty", "payload": {"tag": tag}}
    )
    assert status == 201, (status, body, web.output()[-2000:])
    status, again = web.request("GET", f"/chamvi/api/runs/{body['id']}/", web.token)
    assert status == 200, (status, again)
    return {tag: body["id"]}


def _pg_restart() -> None:
    version = next(p.name for p in Path("/etc/postgresql").iterdir())
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _redis_restart(redis) -> None:
    with contextlib.suppress(Exception):  # the connection drops as the server stops
        redis.shutdown(nosave=True)
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    wait_for(lambda: _ping(redis), 30, "Redis to answer")


def _ping(redis) -> bool:
    try:
        return bool(redis.ping())
    except Exception:
        return False


@restarts_services
def test_web_and_workers_survive_a_postgresql_restart(model, pool, web, record):
    model.pause = 0.5
    before = _web_starts_and_reads_a_run(web)
    first = [pool.spawn(), pool.spawn()]
    runs = start_tagged(4)
    wait_for(lambda: Run.objects.filter(pk__in=runs.values(), status="running").exists(), 30, "a running run")
    _pg_restart()
    connection.close()
    wait_for(lambda: _db_ok(), 30, "PostgreSQL to answer")
    faults = Counter([*runs, *before])  # any run may have lost its step in flight
    recover(runs.values(), pool)
    assert all(w.proc.poll() is None for w in first), "a worker died with the database restart"
    assert web.proc.poll() is None
    more = {**start_tagged(2), **before, **_web_starts_and_reads_a_run(web)}
    recover(more.values(), pool)
    report = check({**runs, **more}, model, pool, faults)
    record("PostgreSQL fast restart mid-run", report)


def _db_ok() -> bool:
    try:
        connection.close()
        return Run.objects.exists() or True
    except Exception:
        return False


@restarts_services
def test_web_and_workers_survive_a_redis_flush_and_restart(model, pool, redis, web, record):
    model.pause = 0.3
    before = _web_starts_and_reads_a_run(web)
    first = [pool.spawn(), pool.spawn()]
    runs = start_tagged(6)
    time.sleep(0.5)
    redis.flushdb()  # queued jobs, events and worker registrations are gone
    recover(runs.values(), pool)
    _redis_restart(redis)
    more = {**start_tagged(4), **before, **_web_starts_and_reads_a_run(web)}
    recover(more.values(), pool)
    dead = [w for w in first if w.proc.poll() is not None]
    assert not dead, "a worker died with the Redis restart:\n" + "\n".join(w.output()[-3000:] for w in dead)
    assert web.proc.poll() is None
    faults = Counter([*runs, *before])
    report = check({**runs, **more}, model, pool, faults)
    record("Redis FLUSHDB then restart", report)
