"""Structured logs: every record logged while a run executes names its run, attempt and worker
(``chamvi_runs.logs``), in this process and in a real worker writing JSON lines."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
from collections.abc import Iterator

import pytest
from django.db import connection

from chamvi_runs import start_run, store
from chamvi_runs.core import log_context
from chamvi_runs.core.log_context import LogContext
from chamvi_runs.logs import JsonFormatter, RunContextFilter
from chamvi_runs.runtime import engine
from tests.support.helpers import events, expire_lease
from tests.support.processes import WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, delay, finish, text, tool_call

pytestmark = pytest.mark.timeout(60)


def _json_logger(name: str) -> tuple[logging.Logger, io.StringIO, logging.Handler]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RunContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    return logger, stream, handler


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_names_the_run_it_was_logged_for_and_none_outside_one():
    logger, stream, handler = _json_logger("tests.logs.unit")
    logger.propagate, logger.level = False, logging.INFO
    try:
        logger.info("before %s", "any run")
        with log_context.bound(LogContext("run_abc", 3, "host:1:2:ff")):
            try:
                raise ValueError("bad\nthing")
            except ValueError:
                logger.exception("inside")
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
    before, inside, after = _lines(stream)  # one JSON object per line, the traceback's newlines escaped
    assert before["message"] == "before any run" and before["level"] == "INFO"
    assert (before["run_id"], before["attempt"], before["worker"], before["exc"]) == (None, None, None, None)
    assert (inside["run_id"], inside["attempt"], inside["worker"]) == ("run_abc", 3, "host:1:2:ff")
    assert inside["logger"] == "tests.logs.unit" and inside["level"] == "ERROR"
    assert "ValueError: bad\nthing" in inside["exc"] and "Traceback" in inside["exc"]
    assert inside["time"].endswith("+00:00") and "T" in inside["time"]
    assert after["run_id"] is None


def test_the_filter_serves_text_formats_with_empty_strings_outside_a_run():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RunContextFilter())
    handler.setFormatter(logging.Formatter("%(message)s run=%(run_id)s attempt=%(attempt)s by=%(worker)s"))
    logger = logging.getLogger("tests.logs.text")
    logger.addHandler(handler)
    logger.propagate, logger.level = False, logging.INFO
    try:
        logger.info("outside")
        with log_context.bound(LogContext("run_x", 1, "w")):
            logger.info("inside")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["outside run= attempt= by=", "inside run=run_x attempt=1 by=w"]


@pytest.fixture
def chamvi_json() -> Iterator[io.StringIO]:
    """JSON lines of every record of the chamvi_runs loggers, as a site's handler would get them."""
    logger, stream, handler = _json_logger("chamvi_runs")
    yield stream
    logger.removeHandler(handler)


def _explode(reason: str, *, pause: float = 0) -> Reply:
    return Reply(
        delay(pause), tool_call("c1", "explode", json.dumps({"reason": reason})), finish("tool_calls")
    )


@pytest.mark.django_db(transaction=True)
def test_runs_executing_side_by_side_each_log_their_own_run(server, chamvi_json):
    """Two executions in two threads of one process: a tool's error is logged with the run, attempt
    and worker of the execution that called it, never its neighbour's; after them, with none."""
    server.script("m-basic", [_explode("in basic", pause=0.3), Reply(text("sorry"), finish("stop"))])
    server.script("m-limited", [_explode("in limited", pause=0.3), Reply(text("sorry"), finish("stop"))])
    runs = {"basic": start_run("basic", "x"), "limited": start_run("limited", "y")}

    def execute(run_id: str, owner: str) -> None:
        try:
            engine.execute(run_id, owner=owner)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=execute, args=(run.pk, f"worker-{name}")) for name, run in runs.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    logging.getLogger("chamvi_runs.tests").warning("after the runs")
    records = _lines(chamvi_json)
    raised = {r["run_id"]: r for r in records if r["message"] == "tool explode raised"}
    assert set(raised) == {runs["basic"].pk, runs["limited"].pk}
    for name, run in runs.items():
        assert raised[run.pk]["attempt"] == 1 and raised[run.pk]["worker"] == f"worker-{name}"
        assert f"RuntimeError: exploded: in {name}" in raised[run.pk]["exc"]
    assert records[-1]["message"] == "after the runs" and records[-1]["run_id"] is None


# --- a real worker process ----------------------------------------------------------------------


def _json_lines(worker: WorkerProcess) -> list[dict]:
    """The worker's JSON log lines (RQ's own lines are text)."""
    return [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]


@pytest.mark.django_db(transaction=True)
def test_a_worker_logs_json_lines_naming_the_run_of_a_tool_error_and_of_a_lost_lease(server):
    server.script(
        "m-basic",
        [
            _explode("on the worker"),
            Reply(text("sorry"), finish("stop")),
            Reply(text("slow "), delay(10), text("answer"), finish("stop")),
        ],
    )
    worker = WorkerProcess(worker_env(server.base_url, CHAMVI_LOG_JSON="1"))
    try:
        failing = start_run("basic", "x")
        wait_for(
            lambda: any(r["message"] == "tool explode raised" for r in _json_lines(worker)),
            30,
            lambda: "the tool's error in the log\n" + worker.output(),
        )
        [raised] = [r for r in _json_lines(worker) if r["message"] == "tool explode raised"]
        assert (raised["run_id"], raised["attempt"], raised["level"]) == (failing.pk, 1, "INFO")
        # The claim's owner: this host, the worker's pid, the executing thread.
        assert raised["worker"].startswith(f"{socket.gethostname()}:{worker.pid}:")
        assert "RuntimeError: exploded: on the worker" in raised["exc"]

        lost = start_run("basic", "y")
        wait_for(lambda: any(e["type"] == "delta" for e in events(lost)), 30, worker.output)
        expire_lease(lost.pk)
        assert store.claim(lost.pk, "thief", 30) is not None
        wait_for(
            lambda: (
                len([r for r in _json_lines(worker) if r["run_id"] == lost.pk and "lease" in r["message"]])
                >= 2
            ),
            15,
            lambda: "the lost lease in the log\n" + worker.output(),
        )
        about_lease = [r for r in _json_lines(worker) if r["run_id"] == lost.pk and "lease" in r["message"]]
        # The lease keeper's thread notices, then the execution stops: both name the run's attempt 1.
        assert {r["logger"] for r in about_lease} == {
            "chamvi_runs.runtime.lease_keeper",
            "chamvi_runs.runtime.engine",
        }
        assert {(r["attempt"], r["level"]) for r in about_lease} == {(1, "WARNING")}
        assert len({r["worker"] for r in about_lease}) == 1
        assert raised["worker"] != about_lease[0]["worker"], "each claim has an owner of its own"
    finally:
        worker.stop()
