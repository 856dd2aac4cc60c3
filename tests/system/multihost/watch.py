"""A browser on the web host: one websocket per run id given, each read until its run.end. Prints
every run's messages as one JSON object when all have ended (or the time is up)."""

import asyncio
import json
import sys

from tests.support.ws_client import Socket


async def follow(port: int, cookie: str, run_id: str, timeout: float) -> list[dict]:
    socket = await Socket.open(port, f"/ws/chamvi/runs/{run_id}/?after=0", cookie)
    try:
        return await socket.until("run.end", timeout)
    finally:
        await socket.close()


async def main(port: int, cookie: str, timeout: float, run_ids: list[str]) -> None:
    results = await asyncio.gather(*(follow(port, cookie, r, timeout) for r in run_ids))
    print(json.dumps(dict(zip(run_ids, results, strict=True))))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
