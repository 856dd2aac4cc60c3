"""MCP servers' tools for agents (SPEC §15), with the ``mcp`` extra: ``pip install chamvi-runs[mcp]``.

    from chamvi_runs.mcp import mcp_tools

    crm = mcp_tools("crm", url="https://crm.internal/mcp", effects=["create_ticket"],
                    approvals={"create_ticket": True})
    Agent("support", model="gpt-4o-mini", tools=[lookup_order, crm])

Importing this package does not import ``mcp`` (a second or more): a process imports it when it
first lists or calls a server's tools. See docs/mcp.md."""

from __future__ import annotations

from .toolset import IDEMPOTENCY_KEY, MCPTool, MCPToolError, MCPTools, MCPUnavailable

mcp_tools = MCPTools
"""``mcp_tools(name, *, command=... | url=..., ...)``: the tools of one MCP server (``MCPTools``)."""

__all__ = ["IDEMPOTENCY_KEY", "MCPTool", "MCPToolError", "MCPTools", "MCPUnavailable", "mcp_tools"]
