"""MCP servers' tools (SPEC §15), against a real MCP server process (``tests/support/mcp_server.py``)
over stdio and streamable HTTP, through the real ``mcp`` client: listing recorded with the run,
validation, approvals, effects with their idempotency key, and a server down, slow or dying as the
call's error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chamvi_runs import Agent, approve, start_run, tool
from chamvi_runs.agents.agent import registry
from chamvi_runs.errors import InvalidAnswer
from chamvi_runs.mcp import mcp_tools
from chamvi_runs.models import EffectRecord, Run, Step, WaitPoint
from tests.support.helpers import execute
from tests.support.processes import ROOT, wait_for
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SERVER = [sys.executable, "-m", "tests.support.mcp_server"]


@tool
def note(text: str) -> str:
    """Keep a note."""
    return f"noted: {text}"


class Site:
    """One test's MCP server log, and the agents it defines (unregistered after the test)."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "mcp.jsonl"
        self.env = {"CHAMVI_TEST_MCP_LOG": str(self.log)}
        self.names: list[str] = []
        self.toolsets: list[Any] = []

    def calls(self, tool_name: str | None = None) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [c for c in map(json.loads, lines) if tool_name is None or c["tool"] == tool_name]

    def stdio(self, **options: Any) -> Any:
        env = {**self.env, **options.pop("env", {})}
        return self.kept(mcp_tools("crm", command=SERVER, cwd=str(ROOT), env=env, prefix="crm_", **options))

    def kept(self, toolset: Any) -> Any:
        self.toolsets.append(toolset)
        return toolset

    def agent(self, name: str, *tools: Any, **options: Any) -> Agent:
        self.names.append(name)
        return Agent(name, model=f"m-{name}", tools=[note, *tools], **options)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    defined = Site(tmp_path)
    yield defined
    for name in defined.names:
        registry.unregister(name)
    for toolset in defined.toolsets:
        toolset.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_server(site: Site) -> Iterator[Callable[[], str]]:
    """Start the server on streamable HTTP (call it again after stopping it: same port); yields
    the starter, which returns its URL, and stops it after the test."""
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        env = {**__import__("os").environ, **site.env}
        proc = subprocess.Popen([*SERVER, "--http", str(port)], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_for(lambda: _answers(port), 20, f"the MCP server on port {port}")
        return f"http://127.0.0.1:{port}/mcp"

    start.stop = lambda: [p.kill() or p.wait(10) for p in procs]  # type: ignore[attr-defined]
    yield start
    start.stop()  # type: ignore[attr-defined]


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


def _results(run: Run) -> list[tuple[str, Any, str]]:
    return list(
        Step.objects.filter(run=run, kind="tool").order_by("index").values_list("name", "output", "error")
    )


def test_a_stdio_servers_tools_are_offered_called_and_their_listing_recorded_with_the_run(server, site):
    crm = site.stdio()
    site.agent("mcp_basic", crm)
    server.script(
        "m-mcp_basic",
        [
            Reply(tool_call("c1", "crm_lookup_order", '{"order_id": 7}'), finish("tool_calls")),
            Reply(text("Order 7 has shipped."), finish("stop")),
        ],
    )
    run = execute(start_run("mcp_basic", "where is order 7?"))
    assert run.status == "completed" and run.output == "Order 7 has shipped."
    assert _results(run) == [("crm_lookup_order", {"result": "order 7: shipped"}, "")]
    assert [c["arguments"] for c in site.calls()] == [{"order_id": 7}]
    first = server.requests_for("m-mcp_basic")[0]
    assert _tool_names(first) == [
        "crm_broken",
        "crm_crash",
        "crm_create_ticket",
        "crm_environment",
        "crm_lookup_order",
        "crm_refuse",
        "crm_slow",
        "note",
    ]
    described = next(t["function"] for t in first["tools"] if t["function"]["name"] == "crm_lookup_order")
    assert described["description"] == "Look up an order by its number."
    assert described["parameters"]["properties"]["order_id"]["type"] == "integer"
    assert sorted(t["name"] for t in run.listed_tools["crm"]) == [
        "broken",
        "crash",
        "create_ticket",
        "environment",
        "lookup_order",
        "refuse",
        "slow",
    ]
    # The result is what the model read next.
    answer = server.requests_for("m-mcp_basic")[1]["messages"][-1]
    assert answer["role"] == "tool" and json.loads(answer["content"]) == {"result": "order 7: shipped"}


def test_arguments_that_do_not_fit_the_servers_schema_are_the_models_to_fix_and_never_reach_it(server, site):
    site.agent("mcp_invalid", site.stdio())
    server.script(
        "m-mcp_invalid",
        [
            Reply(tool_call("c1", "crm_lookup_order", '{"order_id": "seven"}'), finish("tool_calls")),
            Reply(tool_call("c2", "crm_create_ticket", '{"subject": "x"}'), finish("tool_calls")),
            Reply(text("Sorry."), finish("stop")),
        ],
    )
    run = execute(start_run("mcp_invalid", "order seven"))
    assert run.status == "completed"
    results = _results(run)
    assert (
        results[0][2]
        == "invalid call: invalid arguments for crm_lookup_order: order_id: 'seven' is not of type 'integer'"
    )
    assert (
        results[1][2]
        == "invalid call: invalid arguments for crm_create_ticket: (root): 'priority' is a required property"
    )
    assert site.calls() == []


def test_an_effect_needing_approval_waits_takes_an_edit_checked_against_the_servers_schema_and_runs_once(
    server, site
):
    crm = site.stdio(effects=["create_ticket"], approvals={"create_ticket": True})
    site.agent("mcp_approval", crm)
    server.script(
        "m-mcp_approval",
        [
            Reply(
                tool_call("c1", "crm_create_ticket", '{"subject": "broken lamp", "priority": 1}'),
                finish("tool_calls"),
            )
        ],
    )
    run = execute(start_run("mcp_approval", "my lamp is broken"))
    assert run.status == "waiting" and site.calls() == []
    waitpoint = WaitPoint.objects.get(run=run)
    assert (waitpoint.tool_name, waitpoint.input) == (
        "crm_create_ticket",
        {"subject": "broken lamp", "priority": 1},
    )
    with pytest.raises(InvalidAnswer, match="priority: 'high' is not of type 'integer'"):
        approve(waitpoint.approval_id, arguments={"subject": "broken lamp", "priority": "high"})
    approve(waitpoint.approval_id, arguments={"subject": "broken lamp", "priority": 3})
    server.script("m-mcp_approval", [Reply(text("Ticket T-1 is open."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    record = EffectRecord.objects.get(run=run)
    [call] = site.calls("create_ticket")
    assert call["arguments"] == {"subject": "broken lamp", "priority": 3}
    assert call["key"] == record.key and record.output["ticket"] == "T-1"
    # A repeat of the execution (a worker that died before saving its step) finds the record.
    assert execute(run).status == "completed" and len(site.calls("create_ticket")) == 1


def test_a_resumed_run_keeps_the_tools_it_started_with_while_a_new_run_sees_the_upgraded_server(server, site):
    crm = site.stdio(approvals={"create_ticket": True})
    site.agent("mcp_upgrade", crm)
    server.script(
        "m-mcp_upgrade",
        [
            Reply(
                tool_call("c1", "crm_create_ticket", '{"subject": "a", "priority": 1}'), finish("tool_calls")
            )
        ],
    )
    run = execute(start_run("mcp_upgrade", "open a ticket"))
    assert run.status == "waiting"
    # The server is upgraded while the run waits: its next connection is to the new release.
    crm.env["CHAMVI_TEST_MCP_RELEASE"] = "v2"
    crm.close()
    approve(WaitPoint.objects.get(run=run).approval_id)
    server.script("m-mcp_upgrade", [Reply(text("Done."), finish("stop"))])
    assert execute(run).status == "completed"
    resumed = server.requests_for("m-mcp_upgrade")[1]
    assert "crm_cancel_order" not in _tool_names(resumed)
    assert (
        next(t for t in resumed["tools"] if t["function"]["name"] == "crm_lookup_order")["function"][
            "parameters"
        ]["properties"]["order_id"]["type"]
        == "integer"
    )
    server.script("m-mcp_upgrade", [Reply(text("Hi."), finish("stop"))])
    fresh = execute(start_run("mcp_upgrade", "hello"))
    assert "crm_cancel_order" in _tool_names(server.requests_for("m-mcp_upgrade")[2])
    assert "cancel_order" in {t["name"] for t in fresh.listed_tools["crm"]}


def test_a_slow_server_a_failing_tool_and_a_dying_server_are_call_errors_and_the_next_call_reconnects(
    server, site
):
    site.agent("mcp_trouble", site.stdio(timeout=1))
    server.script(
        "m-mcp_trouble",
        [
            Reply(tool_call("c1", "crm_slow", '{"seconds": 10}'), finish("tool_calls")),
            Reply(tool_call("c2", "crm_broken", "{}"), finish("tool_calls")),
            Reply(
                tool_call("c3", "crm_crash", "{}"), tool_call("c3b", "crm_refuse", "{}"), finish("tool_calls")
            ),
            Reply(tool_call("c4", "crm_lookup_order", '{"order_id": 1}'), finish("tool_calls")),
            Reply(text("Done."), finish("stop")),
        ],
    )
    run = execute(start_run("mcp_trouble", "try everything"))
    assert run.status == "completed"
    slow, broken, crash, refused, lookup = _results(run)
    assert (
        slow[2] == "MCPUnavailable: MCP server 'crm': no answer within 1 s; whether slow ran there is unknown"
    )
    assert broken[2].startswith("MCPToolError: Error executing tool broken")
    assert crash[2].startswith("MCPUnavailable: MCP server 'crm': the connection closed")
    # A server that refuses the call with a JSON-RPC error: the model reads why.
    assert (
        refused[2]
        == "MCPToolError: MCP server 'crm' refused refuse: refused by policy (JSON-RPC error -32602)"
    )
    assert lookup == ("crm_lookup_order", {"result": "order 1: shipped"}, "")
    # The model read each error as the call's result.
    errors = [
        m["content"] for m in server.requests_for("m-mcp_trouble")[-1]["messages"] if m["role"] == "tool"
    ]
    assert errors[0].startswith("Error: MCPUnavailable")


def test_a_streamable_http_server_down_at_the_start_leaves_its_tools_out_and_down_at_a_call_is_its_error(
    server, site, http_server
):
    url = http_server()
    crm = site.kept(
        mcp_tools("crm", url=url, prefix="crm_", approvals={"create_ticket": True}, connect_timeout=2)
    )
    site.agent("mcp_http", crm)
    server.script(
        "m-mcp_http",
        [
            Reply(tool_call("c1", "crm_lookup_order", '{"order_id": 5}'), finish("tool_calls")),
            Reply(
                tool_call("c2", "crm_create_ticket", '{"subject": "s", "priority": 2}'), finish("tool_calls")
            ),
        ],
    )
    run = execute(start_run("mcp_http", "order 5"))
    assert run.status == "waiting"
    assert _results(run)[0] == ("crm_lookup_order", {"result": "order 5: shipped"}, "")
    http_server.stop()  # type: ignore[attr-defined]
    approve(WaitPoint.objects.get(run=run).approval_id)
    server.script("m-mcp_http", [Reply(text("The CRM is down."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    assert _results(run)[1][2].startswith("MCPUnavailable: MCP server 'crm': ")
    # A run that starts while the server is down has none of its tools, and records nothing: its
    # next execution lists again.
    server.script("m-mcp_http", [Reply(text("Without the CRM."), finish("stop"))])
    down = execute(start_run("mcp_http", "hello"))
    assert down.status == "completed" and down.listed_tools is None
    assert _tool_names(server.requests_for("m-mcp_http")[-1]) == ["note"]


def test_a_configuration_that_names_a_tool_the_server_does_not_list_offers_none_of_its_tools(
    server, site, caplog
):
    site.agent("mcp_typo", site.stdio(approvals={"create_tiket": True}))
    server.script("m-mcp_typo", [Reply(text("No CRM."), finish("stop"))])
    run = execute(start_run("mcp_typo", "hello"))
    assert run.status == "completed" and run.listed_tools is None
    assert _tool_names(server.requests_for("m-mcp_typo")[0]) == ["note"]
    assert "MCP server 'crm' lists no tool named 'create_tiket'" in caplog.text


def test_the_documented_agent_runs_low_priority_tickets_at_once_and_asks_approval_for_urgent_ones(
    server, site
):
    from tests.docsamples import block, load_module

    sample = load_module("docs_mcp_sample", block("mcp-agent"))
    agent = sample.support_agent(SERVER)
    site.names.append(agent.name)
    site.kept(next(t for t in agent.tools if not hasattr(t, "fn")))
    server.script(
        "gpt-4o-mini",
        [
            Reply(
                tool_call("c1", "crm_create_ticket", '{"subject": "slow site", "priority": 1}'),
                tool_call("c2", "crm_create_ticket", '{"subject": "site down", "priority": 3}'),
                finish("tool_calls"),
            )
        ],
    )
    run = execute(start_run("support_crm", "two problems"))
    assert run.status == "waiting"
    assert WaitPoint.objects.get(run=run).input == {"subject": "site down", "priority": 3}
    assert [(e.tool_name, e.input["priority"]) for e in EffectRecord.objects.filter(run=run)] == [
        ("crm_create_ticket", 1)
    ]
    assert "order_status" in _tool_names(server.requests_for("gpt-4o-mini")[0])


def test_a_stdio_server_gets_its_own_environment_never_the_workers(server, site, monkeypatch):
    monkeypatch.setenv("DATABASE_PASSWORD", "s3cret")
    site.agent("mcp_env", site.stdio(env={"CRM_REGION": "eu"}))
    server.script(
        "m-mcp_env",
        [
            Reply(
                tool_call("c1", "crm_environment", '{"name": "DATABASE_PASSWORD"}'),
                tool_call("c2", "crm_environment", '{"name": "CRM_REGION"}'),
                finish("tool_calls"),
            ),
            Reply(text("Done."), finish("stop")),
        ],
    )
    run = execute(start_run("mcp_env", "hello"))
    assert [output for _name, output, _error in _results(run)] == [{"result": ""}, {"result": "eu"}]


def test_an_approval_edited_in_a_web_request_never_lists_a_server_the_run_did_not(server, site, monkeypatch):
    from chamvi_runs.mcp import MCPTools

    down = site.kept(
        mcp_tools("crm", url=f"http://127.0.0.1:{_free_port()}/mcp", prefix="crm_", connect_timeout=2)
    )
    site.agent("mcp_web", down, approvals={"note": True})
    server.script("m-mcp_web", [Reply(tool_call("c1", "note", '{"text": "a"}'), finish("tool_calls"))])
    run = execute(start_run("mcp_web", "hello"))
    assert run.status == "waiting" and run.listed_tools is None

    def no_listing(self):
        raise AssertionError("a web request listed an MCP server")

    monkeypatch.setattr(MCPTools, "list_tools", no_listing)
    approve(WaitPoint.objects.get(run=run).approval_id, arguments={"text": "b"})
    assert WaitPoint.objects.get(run=run).approved_input == {"text": "b"}
