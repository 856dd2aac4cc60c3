"""Poison runs: a tool that kills its worker fails the run after MAX_ATTEMPTS, model calls lost with
a dead worker count against max_steps, and an execution that saves a step resets the count. Real
worker processes where a worker must die."""

from __future__ import annotations

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Run, Step
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import execute, expire_lease
from tests.support.processes import WorkerProcess, wait_for
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _kill_loop(server, spawn, run: Run, deaths: int) -> list[WorkerProcess]:
    """Let a worker take the run and die in its tool, then move the lease into the past and ring the
    janitor, ``deaths`` times; returns the workers still alive, which take the run next.

    The ``deaths + 1`` workers start at once, so their start-ups (seconds each) overlap: the queue
    holds one job of the run at a time, so each death is a worker of its own."""
    workers = [spawn() for _ in range(deaths + 1)]

    def dead() -> list[WorkerProcess]:
        return [w for w in workers if w.proc.poll() is not None]

    def logs() -> str:
        return "\n".join(w.output()[-1500:] for w in workers)

    for n in range(deaths):
        wait_for(lambda n=n: len(dead()) == n + 1, 40, logs)
        assert all(w.proc.returncode != 0 for w in dead()), logs()
        assert Run.objects.get(pk=run.pk).model_calls == n + 1, "the call the worker died after counts"
        expire_lease(run.pk)
        assert tick_once().enqueued == 1
    return [w for w in workers if w not in dead()]


def _output(workers: list[WorkerProcess]) -> str:
    return "\n".join(w.output() for w in workers)


@pytest.mark.timeout(180)
def test_a_tool_that_kills_its_worker_fails_the_run_after_max_attempts(server, spawn, settings):
    attempts = settings.CHAMVI_RUNS.get("MAX_ATTEMPTS", 5)
    kill = Reply(tool_call("c1", "crash_worker", '{"code": 3}'), usage(100, 10), finish("tool_calls"))
    server.script("m-poison", [kill] * attempts)
    run = start_run("poison", "x")
    rescuers = _kill_loop(server, spawn, run, attempts)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 40, lambda: _output(rescuers))
    run.refresh_from_db()
    assert run.error_code == "too_many_attempts"
    # Every paid call is on the bill, though no step of them was ever saved.
    assert (run.model_calls, run.input_tokens, run.output_tokens) == (attempts, 100 * attempts, 10 * attempts)
    assert not Step.objects.filter(run=run).exists()


@pytest.mark.timeout(120)
def test_model_calls_lost_with_a_dead_worker_count_against_max_steps(server, spawn):
    kill = Reply(tool_call("c1", "crash_worker", '{"code": 3}'), finish("tool_calls"))
    server.script("m-poison_limited", [kill, kill])  # max_steps=2
    run = start_run("poison_limited", "x")
    rescuers = _kill_loop(server, spawn, run, 2)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 40, lambda: _output(rescuers))
    run.refresh_from_db()
    assert (run.error_code, run.model_calls) == ("budget_exceeded", 2)


def test_an_execution_that_saves_a_step_resets_the_count_of_stalled_ones(server):
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(stalled_executions=4)
    server.script("m-basic", [Reply(text("fine"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.stalled_executions == 0
