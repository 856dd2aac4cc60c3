"""What an MCP tool call costs an execution: through ``mcp_tools`` (one kept session per server and
process) against the baseline of a fresh ``mcp.Client`` connection per call, in the same process
and the same run of the bench, to the test MCP server (``tests/support/mcp_server.py``) over stdio.

    .venv/bin/python -m bench.mcp_calls [--calls 200] [--fresh 10]

It prints the median wall time per call of each way, and their ratio. Needs the ``mcp`` extra; no
database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "tests.support.mcp_server"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="calls on the kept session (default 200)")
    parser.add_argument("--fresh", type=int, default=10, help="calls each on a new connection (default 10)")
    args = parser.parse_args()

    from chamvi_runs.mcp import mcp_tools

    crm = mcp_tools("crm", command=SERVER, cwd=str(ROOT))
    first = time.perf_counter()
    crm.call("lookup_order", {"order_id": 1}, None)
    connect = time.perf_counter() - first
    kept = []
    for number in range(args.calls):
        started = time.perf_counter()
        crm.call("lookup_order", {"order_id": number}, None)
        kept.append(time.perf_counter() - started)
    crm.close()

    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], cwd=str(ROOT))

    async def fresh_call(number: int) -> None:
        async with Client(params) as client:
            await client.call_tool("lookup_order", {"order_id": number})

    fresh = []
    for number in range(args.fresh):
        started = time.perf_counter()
        asyncio.run(fresh_call(number))
        fresh.append(time.perf_counter() - started)

    kept_ms, fresh_ms = statistics.median(kept) * 1000, statistics.median(fresh) * 1000
    print(f"first call (starts the server, connects): {connect * 1000:.0f} ms")
    print(f"kept session, median of {args.calls}: {kept_ms:.2f} ms per call")
    print(f"fresh connection, median of {args.fresh}: {fresh_ms:.0f} ms per call (the baseline)")
    print(f"ratio kept / fresh: {kept_ms / fresh_ms:.4f}")


if __name__ == "__main__":
    main()
