"""``mcp_tools`` without a server: its configuration, the tools a listing builds, and what the
agent's version and deploy rules make of a toolset. The calls themselves are tested against a real
MCP server (tests/integration/test_mcp_tools.py)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from chamvi_runs import Agent, tool
from chamvi_runs.agents.agent import registry
from chamvi_runs.agents.versions import missing_tools
from chamvi_runs.errors import ToolArgumentsError
from chamvi_runs.mcp import mcp_tools

pytestmark = pytest.mark.timeout(10)

OBJECT = {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}


@tool
def note(text: str) -> str:
    """Keep a note."""
    return text


def _crm(**options):
    return mcp_tools("crm", command=["crm-server"], prefix="crm_", **options)


def test_a_listing_builds_tools_that_check_their_arguments_against_the_servers_schema():
    (lookup,) = _crm().build([{"name": "lookup", "description": "Find.", "input_schema": OBJECT}])
    assert lookup.schema()["function"] == {"name": "crm_lookup", "description": "Find.", "parameters": OBJECT}
    assert lookup.validate('{"order_id": 7}') == {"order_id": 7}
    with pytest.raises(ToolArgumentsError, match="order_id: 'x' is not of type 'integer'"):
        lookup.validate('{"order_id": "x"}')
    with pytest.raises(ToolArgumentsError, match="must be a JSON object"):
        lookup.validate("[1]")


def test_a_tool_whose_schema_no_validator_can_use_or_whose_name_a_provider_refuses_is_left_out(caplog):
    tools = _crm().build(
        [
            {"name": "typo", "input_schema": {"type": "strng"}},
            {"name": "regex", "input_schema": {"type": "object", "properties": {"c": {"pattern": "("}}}},
            {"name": "has spaces", "input_schema": OBJECT},
            {"name": "fine", "input_schema": OBJECT},
        ]
    )
    assert [t.name for t in tools] == ["crm_fine"]
    assert all(f"tool {name} left out" in caplog.text for name in ("typo", "regex", "has spaces"))


def test_a_schema_that_fails_on_a_value_makes_the_call_invalid_not_the_run_crash():
    # Valid by the meta-schema, but its $ref leads nowhere.
    broken = {"type": "object", "properties": {"code": {"$ref": "#/$defs/nowhere"}}}
    (check,) = _crm().build([{"name": "check", "input_schema": broken}])
    with pytest.raises(ToolArgumentsError, match="its schema cannot check these arguments"):
        check.validate('{"code": "a"}')


def test_effects_and_approvals_are_the_servers_tool_names():
    crm = _crm(effects=["create"], approvals={"create": True})
    create, lookup = crm.build(
        [{"name": "create", "input_schema": OBJECT}, {"name": "lookup", "input_schema": OBJECT}]
    )
    assert (create.effect, create.approval is not None) == (True, True)
    assert (lookup.effect, lookup.approval) == (False, None)
    assert all(t.effect for t in _crm(effects=True).build([{"name": "a"}, {"name": "b"}]))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({}, "give either command="),
        ({"command": ["x"], "url": "http://h/mcp"}, "either command="),
        ({"command": "crm-server"}, "non-empty list of strings"),
        ({"url": "ftp://h/mcp"}, "http:// or https://"),
        ({"command": ["x"], "timeout": 0}, "timeout must be a positive number"),
        ({"command": ["x"], "env": {"A": 1}}, "map strings to strings"),
        ({"command": ["x"], "effects": "create"}, "effects must be a list"),
        ({"command": ["x"], "approvals": {"create": "yes"}}, "must be a bool"),
    ],
)
def test_a_wrong_configuration_is_refused_when_the_agent_is_defined(options, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        mcp_tools("crm", **options)


def test_toolsets_of_one_server_share_the_processs_session_a_tools_factory_included():
    first, again = _crm(), _crm()
    assert first.session() is again.session()
    assert _crm(timeout=5).session() is not first.session()


def test_env_and_headers_never_reach_the_version_or_a_repr():
    secret = mcp_tools(
        "crm", url="https://crm/mcp", headers={"Authorization": "Bearer s3cret"}, env={"K": "s3cret"}
    )
    assert "s3cret" not in repr(secret.describe()) + repr(secret.session().target)


def test_a_tool_a_toolset_may_list_is_not_missing_after_a_deploy_a_removed_python_tool_is():
    agent = Agent("mcp_versions", model="m", tools=[note, _crm(only=["lookup"])])
    try:
        assert missing_tools(agent, frozenset({"note", "crm_lookup", "crm_other", "gone"})) == [
            "crm_other",
            "gone",
        ]
    finally:
        registry.unregister("mcp_versions")


def test_the_agents_approvals_cannot_name_a_servers_tool():
    with pytest.raises(ImproperlyConfigured, match=r"go in its mcp_tools\(approvals=...\)"):
        Agent("mcp_misplaced", model="m", tools=[_crm()], approvals={"crm_create": True})
    assert "mcp_misplaced" not in registry.names()


def test_a_server_behind_headers_reads_as_long_as_a_call_may_take():
    from chamvi_runs.mcp.connection import HTTP_READ_SECONDS, Target

    target = Target(url="https://crm/mcp", headers=(("Authorization", "Bearer t"),))
    _client, http = target.client(timeout=900)
    assert http is not None and http.timeout.read == 900 and http.timeout.connect == 30
    _client, http = target.client(timeout=20)
    assert http is not None and http.timeout.read == HTTP_READ_SECONDS
    assert Target(url="https://crm/mcp").client(timeout=20)[1] is None  # the mcp package's own


def test_only_a_broken_transport_drops_the_session_every_thread_shares(monkeypatch):
    import httpx2

    from chamvi_runs.mcp.connection import Refused, Session, Target, Unreachable

    session = Session(Target(command=("crm-server",)), timeout=1, connect_timeout=1)
    dropped: list[object] = []
    monkeypatch.setattr(session, "_connected", lambda: "the client")
    monkeypatch.setattr(session, "_drop", dropped.append)

    async def breaks_the_protocol(client: object) -> None:
        raise RuntimeError("the result does not match the tool's output schema")

    async def loses_the_connection(client: object) -> None:
        raise ExceptionGroup("transport", [httpx2.ReadError("connection reset")])

    with pytest.raises(Refused, match="output schema"):
        session._on_session(breaks_the_protocol)
    assert dropped == []
    with pytest.raises(Unreachable, match="connection reset"):
        session._on_session(loses_the_connection)
    assert dropped == ["the client"]
