"""An MCP effect tool across worker crashes (SPEC §15), with real ``rqworker`` processes and the test
MCP server as each worker's stdio child: at most once per call by the effect record, and the
idempotency key the server gets is the same on every try of the call, so the server can deduplicate
what the record could not cover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import EffectRecord, Run, Step
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import expire_lease
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TICKET = tool_call("c1", "crm_create_ticket", '{"subject": "broken lamp", "priority": 2}')


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _script(server: Any) -> None:
    """The ticket, asked for twice: the model call of the lost execution is made again (same call,
    same place, same key), then the answer."""
    server.script(
        "m-mcp_desk",
        [
            Reply(TICKET, finish("tool_calls")),
            Reply(TICKET, finish("tool_calls")),
            Reply(text("T-1."), finish("stop")),
        ],
    )


def _recover(run_id: str, spawn: Any, env: dict[str, str]) -> Run:
    """The dead worker's lease is moved into the past in SQL, the janitor rings, and a fresh
    worker (without the fault) finishes the run."""
    run = Run.objects.get(pk=run_id)
    expire_lease(run_id, attempt=run.attempt)
    spawn(env=env)
    tick_once()
    wait_for(lambda: Run.objects.get(pk=run_id).status == "completed", 60, "the recovered run")
    return Run.objects.get(pk=run_id)


def test_a_worker_killed_after_the_servers_work_retries_with_the_same_key_and_the_server_deduplicates(
    server, spawn, tmp_path
):
    log = tmp_path / "mcp.jsonl"
    env = {"CHAMVI_TEST_MCP_LOG": str(log)}
    _script(server)
    doomed = spawn(env={**env, "CHAMVI_TEST_MCP_KILL_CALLER": str(tmp_path / "killed")})
    run = start_run("mcp_desk", "my lamp is broken")
    assert doomed.wait(60) == -9
    assert not EffectRecord.objects.filter(run=run).exists()
    run = _recover(run.pk, spawn, env)
    first, second = _calls(log)
    assert first["key"] == second["key"] == EffectRecord.objects.get(run=run).key
    assert first["pid"] != second["pid"]  # a server of the recovering worker's own
    output = Step.objects.get(run=run, kind="tool").output
    assert output == {"ticket": "T-1", "subject": "broken lamp", "repeated": True}


def test_a_worker_killed_after_the_effect_record_never_calls_the_server_again(server, spawn, tmp_path):
    log = tmp_path / "mcp.jsonl"
    env = {"CHAMVI_TEST_MCP_LOG": str(log)}
    _script(server)
    doomed = spawn(env={**env, "CHAMVI_CRASH_AT": "after_effect_record"})
    run = start_run("mcp_desk", "my lamp is broken")
    assert doomed.wait(60) == -9
    run = _recover(run.pk, spawn, env)
    assert len(_calls(log)) == 1
    assert Step.objects.get(run=run, kind="tool").output == {
        "ticket": "T-1",
        "subject": "broken lamp",
        "repeated": False,
    }
