"""The bench's processes: the model server and the ``manage.py rqworker chamvi`` workers. Each
worker logs to a file of the bench's log directory, which outlives the bench for reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]


class ModelServer:
    def __init__(self, think: float, chunks: int, gap: float) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.concurrency.server",
                "--think",
                str(think),
                "--chunks",
                str(chunks),
                "--gap",
                str(gap),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=5) as response:
            return dict(json.loads(response.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the server leaves when its stdin ends
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Worker:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", "chamvi"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def listening(self) -> bool:
        return "Listening on" in self.output()

    def stop(self) -> None:
        """SIGTERM (it drains and leaves; nothing of ours is running by then), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def worker_env(database_url: str, redis_url: str, model_url: str, concurrency: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.concurrency.settings",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="bench",
        CHAMVI_CONCURRENCY=str(concurrency),
        PYTHONUNBUFFERED="1",
    )
    return env


def start_workers(count: int, env: dict[str, str], logs: Path, timeout: float = 60) -> list[Worker]:
    workers = [Worker(env, logs / f"worker-{n}.log") for n in range(count)]
    deadline = time.monotonic() + timeout
    while not all(worker.listening() for worker in workers):
        dead = [worker for worker in workers if worker.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            for worker in workers:
                worker.stop()
            what = "exited" if dead else f"not listening after {timeout:.0f} s"
            raise RuntimeError(f"worker {what}:\n{(dead or workers)[0].output()[-3000:]}")
        time.sleep(0.1)
    return workers
