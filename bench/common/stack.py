"""The processes of a bench, each started as a deployment starts it and logging to a file:
``daphne project.asgi:application``, ``manage.py rqworker chamvi`` and ``manage.py chamvi_tick``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Process:
    """A child of the checkout's root. Its output goes to ``log`` when given (the file outlives the
    bench, for reading), else to a temporary file removed when it stops. ``stop()`` sends SIGTERM
    and waits ``grace`` seconds before SIGKILL."""

    def __init__(
        self, name: str, args: list[str], environ: dict[str, str], log: Path | None = None, grace: float = 15
    ) -> None:
        self.name = name
        self.grace = grace
        self.keep_log = log is not None
        self.log = log or Path(tempfile.mkstemp(prefix=f"chamvi-bench-{name}-", suffix=".log")[1])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a lost machine would."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self.keep_log:
            self.log.unlink(missing_ok=True)


def http(method: str, url: str) -> dict[str, Any]:
    req = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method)
    with urllib.request.urlopen(req, timeout=10) as response:
        return dict(json.loads(response.read()))


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


class Daphne(Process):
    def __init__(self, port: int, environ: dict[str, str]) -> None:
        self.port = port
        args = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "project.asgi:application",
        ]
        super().__init__("daphne", args, environ)
        wait_for(lambda: reachable(f"http://127.0.0.1:{port}/"), 60, "daphne")


class Worker(Process):
    def __init__(
        self, environ: dict[str, str], index: int, log: Path | None = None, grace: float = 15
    ) -> None:
        args = [sys.executable, "manage.py", "rqworker", "chamvi"]
        super().__init__(f"worker{index}", args, environ, log, grace)

    def ready(self) -> bool:
        return "Listening on" in self.output()


def start_workers(
    count: int, environ: dict[str, str], first: int = 0, logs: Path | None = None, grace: float = 15
) -> list[Worker]:
    """``count`` workers listening on the queue; each logs to ``logs/worker-<n>.log`` with ``logs``."""
    workers = [
        Worker(environ, first + n, logs / f"worker-{first + n}.log" if logs else None, grace)
        for n in range(count)
    ]
    try:
        wait_for(
            lambda: all(w.ready() or not w.alive() for w in workers), 60 + 3 * count, "workers to listen"
        )
    except TimeoutError:
        dead = workers
    else:
        dead = [w for w in workers if not w.alive()]
    if dead:
        output = dead[0].output()[-3000:]
        for worker in workers:
            worker.stop()
        raise RuntimeError(f"a worker died or never listened:\n{output}")
    return workers


class Ticker(Process):
    """``manage.py chamvi_tick`` looping at its default interval, as a deployment runs it."""

    def __init__(self, environ: dict[str, str], interval: float | None = None) -> None:
        extra = ["--interval", str(interval)] if interval is not None else []
        super().__init__("tick", [sys.executable, "manage.py", "chamvi_tick", *extra], environ)
