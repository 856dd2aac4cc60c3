"""A channel-layer tap: joins the groups of the given runs, as daphne's consumers do, and records
receive time minus send stamp for each stamp in their deltas. Compared with what the websocket
clients measure, it splits the latency into model server -> worker -> Redis layer, and what daphne
and the socket add after that.

Runs as ``python -m bench.stream_latency.tap`` with the bench's Django settings in its environment; reads
``{"runs": [...], "patience": s}`` on stdin, prints READY once it is in every group, then one JSON
line ``{"latencies": [...]}``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def tap(run_ids: list[str], patience: float) -> list[float]:
    from channels.layers import get_channel_layer

    from bench.common.stamps import latencies_ms
    from chamvi_runs.streaming.broadcast import events_of, run_group

    layer: Any = get_channel_layer()
    channel = await layer.new_channel()
    for run_id in run_ids:
        await layer.group_add(run_group(run_id), channel)
    print("READY", flush=True)
    latencies: list[float] = []
    open_runs = set(run_ids)
    while open_runs:
        try:
            # Until the first delta the runs wait for their model calls, as long as that takes.
            message = await asyncio.wait_for(layer.receive(channel), patience if latencies else 300)
        except TimeoutError:
            break
        now = time.time()
        for event in events_of(message):
            if event.get("type") == "delta":
                latencies.extend(latencies_ms(event.get("text", ""), now))
            elif event.get("type") == "run.end":
                open_runs.discard(event.get("run_id"))
    return latencies


def main() -> None:
    import django

    django.setup()
    task = json.loads(sys.stdin.readline())
    latencies = asyncio.run(tap(task["runs"], task["patience"]))
    print(json.dumps({"latencies": latencies}), flush=True)


if __name__ == "__main__":
    main()
