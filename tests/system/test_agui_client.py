"""An AG-UI front end on chamvi_runs (SPEC §15): ``@ag-ui/client``'s ``HttpAgent`` (Node, the
protocol's own TypeScript client, which npm installs once into ``.venv``) drives a real daphne and
a real RQ worker through ``POST chamvi/agui/<agent>/``: the client's event verifier accepts every
event, a refund waits as the run's interrupt, and its resume approves it and follows the run to its
answer. Without Node (or npm) it is skipped, and with ``CI=true`` it fails."""

from __future__ import annotations

import json
import subprocess

import pytest

from chamvi_runs.models import EffectRecord, Run, WaitPoint
from chamvi_runs.web.auth import create_token
from tests.docsamples import block
from tests.support.helpers import make_user
from tests.support.processes import ROOT, WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.system.test_js_client import _run, _tool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CLIENT = "@ag-ui/client@1.0.0"
CLIENT_HOME = ROOT / ".venv" / "agui-client"
REFUND = '{"order_id": "o-1", "amount_cents": 500}'


def _client_installed() -> None:
    if not (CLIENT_HOME / "node_modules" / "@ag-ui" / "client").exists():
        npm = _tool("npm")
        installed = _run(
            npm, "install", "--prefix", str(CLIENT_HOME), "--no-audit", "--no-fund", CLIENT, timeout=240
        )
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]


def test_an_agui_client_asks_sees_the_interrupt_approves_it_and_gets_the_answer(server):
    node = _tool("node")
    _client_installed()
    user = make_user("frontend", "add_run", "approve_waitpoint")
    _row, token = create_token(user, "agui")
    server.script(
        "m-approving",
        [
            Reply(text("Refunding."), tool_call("c1", "refund", REFUND), finish("tool_calls")),
            Reply(text("Refunded "), text("500 cents."), finish("stop")),
        ],
    )
    env = worker_env(server.base_url)
    web, worker = WebProcess(env), WorkerProcess(env)
    try:
        wait_for(worker.ready, 60, worker.output)
        url = f"http://127.0.0.1:{web.port}/chamvi/agui/approving/"
        done = subprocess.run(
            [node, "tests/js/agui/drive.mjs", str(CLIENT_HOME), url, token, "agui-thread"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + web.output()[-3000:]
        asked, resumed = (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
        documented = _documented_sample(node, server, url, token)
    finally:
        web.stop()
        worker.stop()
    run = Run.objects.get(thread="agui-thread")
    wait = WaitPoint.objects.get(run=run)
    assert asked["types"][0] == "RUN_STARTED" and asked["types"][-1] == "RUN_FINISHED"
    (interrupt,) = asked["interrupts"]
    assert (interrupt["id"], interrupt["reason"], interrupt["toolCallId"]) == (
        wait.approval_id,
        "approval",
        "c1",
    )
    assistant = next(m for m in asked["messages"] if m["role"] == "assistant" and m["toolCalls"])
    assert assistant["toolCalls"][0]["function"]["name"] == "refund"
    assert json.loads(assistant["toolCalls"][0]["function"]["arguments"]) == json.loads(REFUND)

    assert resumed["interrupts"] == [] and resumed["result"] == "Refunded 500 cents."
    assert run.status == "completed" and wait.decision == "approved" and wait.reason == "photos checked"
    assert EffectRecord.objects.filter(run=run).count() == 1
    tool = next(m for m in resumed["messages"] if m["role"] == "tool")
    assert tool["toolCallId"] == "c1" and json.loads(tool["content"])["refunded"] == 500
    assert resumed["messages"][-1] == {"role": "assistant", "content": "Refunded 500 cents."}
    assert documented["answer"] == "Refunded."
    assert [m["role"] for m in documented["messages"]] == ["user", "assistant", "tool", "assistant"]


def _documented_sample(node: str, server, url: str, token: str) -> dict:
    """docs/agui.md's front end, written next to the client package it imports, asked once."""
    server.script(
        "m-approving",
        [
            Reply(tool_call("c2", "refund", REFUND), finish("tool_calls")),
            Reply(text("Refunded."), finish("stop")),
        ],
    )
    (CLIENT_HOME / "ask.mjs").write_text(block("agui-client"))
    harness = (
        "const {ask} = await import(process.argv[1]);"
        "const done = await ask(process.argv[2], process.argv[3], 'docs-thread', 'Refund o-1.',"
        " () => ({approved: true}));"
        "console.log(JSON.stringify(done));"
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", harness, str(CLIENT_HOME / "ask.mjs"), url, token],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
