"""The model of the latency benches (bench.stream_latency, bench.recovery): a Chat Completions server
that streams paced SSE chunks whose text embeds the moment each chunk was sent (``stamps.stamp()``,
taken right before the write).

tests/support/scripted builds a reply's text when the reply is chosen, before streaming starts, so it cannot
stamp at send time; this server can. It answers every request alike (the model name is ignored):
``--chunks`` chunks of ``--filler`` characters plus a stamp, ``--pace`` seconds before each. With
``--tool-first`` a conversation without a tool result gets the paced text plus a call of ``add``,
and one with a tool result a short final answer: two model calls, so a run writes a step, then
completes. With ``--gated``, requests wait before streaming until ``POST /control/go``, so that all
runs of a round stream at once and every client is subscribed before the first chunk.

    python -m bench.common.stamping_model --port 8870 --chunks 100 --pace 0.02 --gated

``StampingModel`` starts it as a process of its own and drives its gate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from bench.common.stack import Process, http, reachable, wait_for
from bench.common.stamps import stamp

FILLER = "abcdefghijklmnopqrstuvwxyz"


class State:
    def __init__(self, chunks: int, pace: float, filler: int, tool_first: bool, gated: bool) -> None:
        self.chunks, self.pace, self.filler, self.tool_first = chunks, pace, filler, tool_first
        self.go = threading.Event()
        if not gated:
            self.go.set()
        self.lock = threading.Lock()
        self.waiting = self.active = self.served = 0
        self.ids = itertools.count(1)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # many workers connect at once when a round is released
    state: State


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> State:
        return cast(Server, self.server).state

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        state = self.state
        if self.path.startswith("/control/status"):
            with state.lock:
                self._json({"waiting": state.waiting, "active": state.active, "served": state.served})
        else:
            self._json({"object": "list", "data": []})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.startswith("/control/go"):
            self.state.go.set()
            self._json({"ok": True})
        elif self.path.startswith("/control/arm"):
            self.state.go.clear()
            self._json({"ok": True})
        elif self.path.rstrip("/").endswith("/chat/completions"):
            self._complete(body)
        else:
            self._json({"error": {"message": f"unknown path {self.path}"}}, 404)

    def _json(self, payload: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _complete(self, body: dict[str, Any]) -> None:
        state = self.state
        answered = any(m.get("role") == "tool" for m in body.get("messages", []))
        with state.lock:
            state.waiting += 1
        state.go.wait()
        with state.lock:
            state.waiting -= 1
            state.active += 1
        try:
            self._stream(str(body.get("model")), final=state.tool_first and answered)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker was killed mid-stream: routine in the recovery bench
        finally:
            with state.lock:
                state.active -= 1
                state.served += 1
        self.close_connection = True

    def _stream(self, model: str, final: bool) -> None:
        state = self.state
        completion_id = f"chatcmpl-bench-{next(state.ids)}"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

        def send(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> None:
            chunk: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if usage:
                chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
            self._write(f"data: {json.dumps(chunk)}\n\n")

        send({"role": "assistant", "content": ""})
        if final:
            send({"content": "Done."})
            send({}, "stop")
        else:
            # A random phase per stream, as independent model calls have: released together,
            # streams would otherwise send their chunks in lockstep bursts.
            time.sleep(random.uniform(0, state.pace))
            for n in range(state.chunks):
                time.sleep(state.pace)
                filler = "".join(FILLER[(n * state.filler + i) % len(FILLER)] for i in range(state.filler))
                send({"content": filler + stamp()})
            if state.tool_first:
                call = {"index": 0, "id": "call_add", "type": "function"}
                send({"tool_calls": [{**call, "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]})
                send({}, "tool_calls")
            else:
                send({}, "stop")
        send({}, usage=True)
        self._write("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class StampingModel(Process):
    """This server in a process of its own, on ``port``, with the command line's ``options``."""

    def __init__(self, port: int, *options: str) -> None:
        self.port = port
        args = [sys.executable, "-m", "bench.common.stamping_model", "--port", str(port), *options]
        super().__init__("model", args, dict(os.environ, PYTHONUNBUFFERED="1"))
        wait_for(lambda: reachable(self.url("/control/status")), 20, "the model server")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def status(self) -> dict[str, Any]:
        return http("GET", self.url("/control/status"))

    def go(self) -> None:
        http("POST", self.url("/control/go"))

    def arm(self) -> None:
        http("POST", self.url("/control/arm"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--filler", type=int, default=4)
    parser.add_argument("--tool-first", action="store_true")
    parser.add_argument("--gated", action="store_true")
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.state = State(args.chunks, args.pace, args.filler, args.tool_first, args.gated)
    print(f"serving on {args.port}", flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
