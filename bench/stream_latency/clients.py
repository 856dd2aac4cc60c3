"""Websocket clients in processes of their own, so that parsing thousands of frames a second does
not share a loop (or the GIL) with the bench's driver.

A client process reads its task as JSON on stdin (``port``, ``cookie``, ``paths``, ``patience``),
opens one socket per path (``tests.support.ws_client.Socket``: it answers daphne's pings), prints ``READY``,
then follows each socket until ``run.end`` or ``patience`` seconds of silence, and prints one JSON
line: per socket, what arrived (seqs checked for gaps, duplicates and order), the text of its
deltas, and receive time minus send stamp for every stamp in them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import ROOT
from bench.common.stamps import latencies_ms
from tests.support.ws_client import Socket


@dataclass
class Received:
    path: str
    events: int = 0
    deltas: int = 0
    last_seq: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    gaps: int = 0
    ended: bool = False
    closed: str = ""
    text: str = ""
    latencies: list[float] = field(default_factory=list)


async def follow(socket: Socket, got: Received, patience: float, first_timeout: float) -> None:
    seen: set[int] = set()
    attempt = 0
    while not got.ended:
        try:
            event = await socket.receive(patience if got.events else first_timeout)
        except TimeoutError:
            got.closed = "silent"
            break
        except AssertionError as exc:  # the server closed the socket
            got.closed = str(exc)
            break
        now = time.time()
        seq = event.get("seq")
        if seq is None:
            continue  # an ack or error, not a run event
        got.events += 1
        if seq in seen:
            got.duplicates += 1
        elif seq < got.last_seq:
            got.out_of_order += 1
        seen.add(seq)
        got.last_seq = max(got.last_seq, seq)
        kind = event.get("type")
        if kind == "delta" and event.get("kind") == "text":
            got.deltas += 1
            if event["attempt"] > attempt:  # a retried step replaces what an older attempt sent
                attempt, got.text = event["attempt"], ""
            got.text += event["text"]
            got.latencies.extend(latencies_ms(event["text"], now))
        got.ended = kind == "run.end"
    got.gaps = len(set(range(1, got.last_seq + 1)) - seen)


async def serve(task: dict[str, Any]) -> list[Received]:
    port, cookie = task["port"], task["cookie"]
    # A few handshakes at a time: daphne drops a socket its application has not accepted in 5 s.
    gate = asyncio.Semaphore(16)

    async def open_one(path: str) -> Socket:
        async with gate:
            return await Socket.open(port, path, cookie)

    sockets = await asyncio.gather(*(open_one(p) for p in task["paths"]))
    print("READY", flush=True)
    received = [Received(p) for p in task["paths"]]
    await asyncio.gather(
        *(
            follow(s, r, task["patience"], task["first_timeout"])
            for s, r in zip(sockets, received, strict=True)
        )
    )
    await asyncio.gather(*(s.close() for s in sockets))
    return received


def main() -> None:
    task = json.loads(sys.stdin.readline())
    received = asyncio.run(serve(task))
    print(json.dumps([asdict(r) for r in received]), flush=True)


class ClientGroup:
    """``paths`` spread over ``processes`` client processes."""

    def __init__(self, port: int, cookie: str, paths: list[str], processes: int, patience: float) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        processes = max(1, min(processes, len(paths)))
        for n in range(processes):
            task = {
                "port": port,
                "cookie": cookie,
                "paths": paths[n::processes],
                "patience": patience,
                "first_timeout": 300,
            }
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.stream_latency.clients"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(task) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)

    def wait_ready(self) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a client process failed to connect: {line!r}")

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def results(self) -> list[Received]:
        received: list[Received] = []
        for proc in self.procs:
            out, _ = proc.communicate(timeout=600)
            received.extend(Received(**r) for r in json.loads(out.strip().splitlines()[-1]))
        return received


if __name__ == "__main__":
    main()
