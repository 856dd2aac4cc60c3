"""The deployment mode (``chamvi_runs.modes``): chosen from the settings as they are now, built once
per process and setting, and the one place ``EXECUTOR`` is read; its jobs resolve to the functions
they name, and its job ids carry the run the janitor reads back. No test here rings a doorbell:
that executes a run (tests/integration/test_engine_basics.py, tests/system/test_worker_process.py,
and embedded mode in tests/system/test_asgi_app.py and tests/system/test_fresh_site.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

import chamvi_runs
from chamvi_runs import jobs
from chamvi_runs.modes import EXECUTE, EXECUTE_RUN, Embedded, Workers, mode
from chamvi_runs.modes.workers import job_id, run_of
from chamvi_runs.runtime import engine
from chamvi_runs.streaming.buffer import MemoryEventLog, RedisEventLog, event_log
from chamvi_runs.web.consumers import DROPS_KEY

# A queue no other test uses, on a Redis nothing listens on: a client connects only when used.
QUEUE = "unit-modes"
NOWHERE = "redis://127.0.0.1:9/0"


@pytest.fixture
def chamvi(settings):
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, QUEUE: {"URL": NOWHERE}, "unit-modes-2": {"URL": NOWHERE}}

    def set_(**values) -> None:
        settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, **values}

    return set_


def test_the_mode_follows_the_settings_and_is_built_once_per_setting(chamvi):
    chamvi(EXECUTOR="thread", QUEUE=QUEUE)
    embedded = mode()
    assert isinstance(embedded, Embedded)
    chamvi(QUEUE="unit-modes-2")
    assert mode() is embedded, "embedded mode has no queue: one executor and buffer per process"

    chamvi(EXECUTOR="rq", QUEUE=QUEUE)
    workers = mode()
    assert isinstance(workers, Workers) and workers.queue == QUEUE
    assert workers.rq_queue.name == QUEUE and workers.rq_queue.connection is workers.redis
    assert mode() is workers
    chamvi(QUEUE="unit-modes-2")
    assert isinstance(other := mode(), Workers) and other.queue == "unit-modes-2"
    chamvi(QUEUE=QUEUE)
    assert mode() is workers, "one Redis client per queue and process"
    chamvi(EXECUTOR="thread")
    assert mode() is embedded


def test_an_executor_the_checks_refuse_is_refused_here_too(chamvi):
    chamvi(EXECUTOR="celery")
    with pytest.raises(ImproperlyConfigured, match="'celery'"):
        mode()


def test_the_buffer_is_the_one_the_mode_picks(chamvi):
    chamvi(EXECUTOR="thread")
    memory = event_log()
    assert isinstance(memory, MemoryEventLog) and event_log() is memory

    chamvi(EXECUTOR="rq", QUEUE=QUEUE)
    shared = event_log()
    assert isinstance(shared, RedisEventLog) and shared.connection is mode().redis
    assert event_log() is shared
    chamvi(EXECUTOR="thread")
    assert event_log() is memory


def test_jobs_name_the_functions_that_jobs_queued_by_older_releases_name():
    assert EXECUTE_RUN.path == "chamvi_runs.jobs.execute_run"
    assert EXECUTE_RUN.load() is jobs.execute_run
    assert EXECUTE.load() is engine.execute


def test_a_job_id_carries_its_run_for_the_janitor():
    run_id = "run_AbC-12_x"
    made = job_id(run_id)
    assert re.fullmatch(r"chamvi-[0-9a-f]{8}-run_AbC-12_x", made)
    assert made != job_id(run_id), "two doorbells for one run are two jobs"
    assert run_of(made) == run_id
    assert run_of("3f2a-another-app") is None


class _Away:
    def hincrby(self, *args):
        raise redis.exceptions.ConnectionError("Redis is away")


def test_a_failed_count_of_drops_ends_no_stream(chamvi, caplog):
    workers = Workers(QUEUE)
    workers.redis = _Away()
    with caplog.at_level(logging.WARNING, logger="chamvi_runs.modes.workers"):
        workers.count_drops(DROPS_KEY, "gap", 2)
    assert "could not count 2 gap events in chamvi:stream:drops" in caplog.text


def test_only_the_mode_reads_the_executor_setting():
    package = Path(chamvi_runs.__file__).parent
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "conf.EXECUTOR" in path.read_text(encoding="utf-8")
    )
    assert readers == ["modes/__init__.py"]
