"""A real MCP server for the tests, written with the ``mcp`` package: stdio by default, streamable
HTTP with ``--http PORT``.

- ``CHAMVI_TEST_MCP_LOG``: a file each tool call appends a JSON line to (the tool, its arguments,
  the idempotency key the client sent in ``_meta``, the server's pid): a test counts executions.
- ``CHAMVI_TEST_MCP_RELEASE``: ``v2`` serves another ``lookup_order`` (its ``order_id`` a string)
  and a ``cancel_order``, as a server upgraded while runs wait.
- ``CHAMVI_TEST_MCP_KILL_CALLER``: a file path; the first ``create_ticket`` that finds it missing
  creates it, does its work, and SIGKILLs its parent (the stdio client: a worker) before answering,
  as a worker that dies between a server's work and its own record of it.

``create_ticket`` deduplicates on the idempotency key, as a careful server does: a repeated key gets
the ticket the first call opened, marked ``repeated``.

    python -m tests.support.mcp_server [--http PORT]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer

IDEMPOTENCY_KEY = "chamvi-runs/idempotency-key"
RELEASE = os.environ.get("CHAMVI_TEST_MCP_RELEASE", "v1")

server = MCPServer("chamvi-test-crm", log_level="ERROR")


def _log(tool: str, arguments: dict[str, Any], key: str | None = None) -> None:
    path = os.environ.get("CHAMVI_TEST_MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            line = {"tool": tool, "arguments": arguments, "key": key, "pid": os.getpid()}
            log.write(json.dumps(line) + "\n")


def _logged() -> list[dict[str, Any]]:
    path = os.environ.get("CHAMVI_TEST_MCP_LOG")
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as log:
        return [json.loads(line) for line in log]


def _key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    return meta.get(IDEMPOTENCY_KEY) if isinstance(meta, dict) else None


if RELEASE == "v2":

    @server.tool()
    def lookup_order(order_id: str) -> str:
        """Look up an order by its reference."""
        _log("lookup_order", {"order_id": order_id})
        return f"order {order_id}: delivered"

    @server.tool()
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        _log("cancel_order", {"order_id": order_id})
        return f"order {order_id}: cancelled"

else:

    @server.tool()
    def lookup_order(order_id: int) -> str:
        """Look up an order by its number."""
        _log("lookup_order", {"order_id": order_id})
        return f"order {order_id}: shipped"


@server.tool()
def create_ticket(subject: str, priority: int, ctx: Context) -> dict[str, Any]:
    """Open a support ticket."""
    key = _key(ctx)
    opened = [c["key"] for c in _logged() if c["tool"] == "create_ticket" and c["key"] is not None]
    _log("create_ticket", {"subject": subject, "priority": priority}, key)
    # Deduplicated across the server's restarts: its log is its database.
    keys = list(dict.fromkeys(opened))
    ticket = {
        "ticket": f"T-{keys.index(key) + 1 if key in keys else len(keys) + 1}",
        "subject": subject,
        "repeated": key in keys,
    }
    kill = os.environ.get("CHAMVI_TEST_MCP_KILL_CALLER")
    if kill and not os.path.exists(kill):
        open(kill, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)
    return ticket


@server.tool()
def slow(seconds: float) -> str:
    """Answer after ``seconds``."""
    time.sleep(seconds)
    return "done"


@server.tool()
def environment(name: str) -> str:
    """The server's environment variable ``name`` (empty: unset)."""
    return os.environ.get(name, "")


@server.tool()
def broken() -> str:
    """Always fails."""
    raise RuntimeError("the CRM database is down")


@server.tool()
def refuse() -> str:
    """Answered with a JSON-RPC error rather than a tool error."""
    raise MCPError(-32602, "refused by policy")


@server.tool()
def crash() -> str:
    """The server process dies while answering."""
    os._exit(3)


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
