"""The thinking model: every chat completion waits ``think`` seconds before its first chunk, then
streams the same short answer. Run as its own process (``python -m bench.concurrency.server``) so
that its 200 sleeping streams share no GIL with the driver's sampling; it prints its port.

It is the tests' scripted server (``tests.scripted``: one thread per request) with a listen backlog
large enough for every run to connect at once (socketserver's default of 5 would make the kernel
drop SYNs, and the clients would retry them a second later) and a ``GET /stats`` of its own."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.scripted.handler import ScriptedHandler, ScriptedHTTPServer
from tests.scripted.state import ServerState
from tests.scripted_server import Reply, delay, finish, text, usage

MODEL = "m-basic"


def answer_chunks(chunks: int) -> list[str]:
    """The answer's text chunks: numbered, so that a lost or repeated chunk shows in the stored text."""
    return [f"part{n:02d} " for n in range(chunks)]


def answer(chunks: int) -> str:
    return "".join(answer_chunks(chunks))


def reply(think: float, chunks: int, gap: float) -> Reply:
    events: list[Any] = [delay(think)]
    for piece in answer_chunks(chunks):
        events.append(text(piece))
        if gap:
            events.append(delay(gap))
    return Reply(*events, finish("stop"), usage(20, chunks))


class BenchHTTPServer(ScriptedHTTPServer):
    request_queue_size = 1024
    peak = 0


class BenchHandler(ScriptedHandler):
    @contextmanager
    def _busy(self) -> Iterator[None]:
        with super()._busy():
            server = self.server
            assert isinstance(server, BenchHTTPServer)
            with self.state.idle:
                server.peak = max(server.peak, self.state.active)
            yield

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/stats"):
            server = self.server
            assert isinstance(server, BenchHTTPServer)
            with self.state.lock:
                stats = {"requests": self.state.counter, "active": self.state.active, "peak": server.peak}
            self._send_json(200, stats)
        else:
            super().do_GET()


WARMUP = "warmup"
"""A run whose payload holds this word gets its answer without thinking: it only warms a worker up
(imports, the client's first connection) before the measured batches."""


def serve(think: float, chunks: int, gap: float) -> None:
    state = ServerState()

    def respond(body: dict[str, Any]) -> Reply:
        warm = WARMUP in str(body.get("messages"))
        return reply(0 if warm else think, chunks, gap)

    state.responders[MODEL] = respond
    httpd = BenchHTTPServer(("127.0.0.1", 0), BenchHandler)
    httpd.state = state
    print(httpd.server_address[1], flush=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    # The driver closes our stdin when it is done (or dies): that is our signal to leave.
    sys.stdin.read()
    state.stopping.set()
    httpd.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--think", type=float, default=10.0)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between answer chunks")
    args = parser.parse_args()
    serve(args.think, args.chunks, args.gap)


if __name__ == "__main__":
    main()
