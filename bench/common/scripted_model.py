"""The tests' scripted model (``tests.support.scripted``: one thread per request) as a process of its own,
so that its streams share no GIL with what a bench measures. A bench's model module answers with
its own replies (bench.compare.workload_model, bench.concurrency.thinking_model): it calls
``serve``, which prints ``{"base_url": ..., "pid": ...}`` and serves until stdin closes.

The server's listen backlog is large enough for every run to connect at once (socketserver's default
of 5 would make the kernel drop SYNs, and the clients would retry them a second later), and
``GET /v1/stats`` says how many requests it served and how many streams it held at once at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import ROOT
from tests.support.scripted.handler import ScriptedHandler, ScriptedHTTPServer
from tests.support.scripted.state import ServerState
from tests.support.scripted_server import Reply

Responder = Callable[[dict[str, Any]], Reply]


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


def serve(responders: dict[str, Responder]) -> None:
    """Answer each model of ``responders`` with its replies until stdin closes: the parent closes it
    when it is done, and it closes too should the parent die."""
    state = ServerState()
    state.responders.update(responders)
    httpd = BenchHTTPServer(("127.0.0.1", 0), BenchHandler)
    httpd.state = state
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    print(json.dumps({"base_url": base_url, "pid": os.getpid()}), flush=True)
    sys.stdin.read()
    state.stopping.set()
    httpd.shutdown()


class ScriptedModel:
    """``python -m <module> <args>`` (a module that calls ``serve``), listening at ``base_url``."""

    def __init__(self, module: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = str(json.loads(self.proc.stdout.readline())["base_url"])

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=5) as response:
            return dict(json.loads(response.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
