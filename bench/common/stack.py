"""The processes of a bench, each started as a deployment would start it, logging to a file:
the model server, ``daphne project.asgi:application``, ``manage.py rqworker chamvi`` and
``manage.py chamvi_tick``; and their own database (``chamvi_lat_*``) and Redis db."""

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

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[2]
PG = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/10"
SETTINGS = "bench.latency_settings"
PORTS = range(8870, 8900)
TICKS = os.sysconf("SC_CLK_TCK")


def env(database: str, model_port: int, **extra: str) -> dict[str, str]:
    base = dict(os.environ)
    base.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        DATABASE_URL=f"{PG}/{database}",
        REDIS_URL=REDIS_URL,
        OPENAI_BASE_URL=f"http://127.0.0.1:{model_port}/v1",
        OPENAI_API_KEY="bench",
        PYTHONUNBUFFERED="1",
        CHAMVI_LOG_LEVEL="WARNING",
        **extra,
    )
    return base


LOCK = "chamvi_lat:bench"


def take_redis(owner: str) -> None:
    """Both benches use Redis db 10 and its queue ``chamvi``: one bench at a time (a worker of one
    would take the other's jobs). A lock left by a process that died is taken over."""
    client = redis.Redis.from_url(REDIS_URL)
    held = client.get(LOCK)
    if held and Path(f"/proc/{int(held.split(b':')[0])}").exists():
        raise SystemExit(f"another latency bench holds Redis db 10: {held.decode()}")
    client.set(LOCK, f"{os.getpid()}:{owner}")


def release_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    if (client.get(LOCK) or b"").split(b":")[0] == str(os.getpid()).encode():
        client.delete(LOCK)


def fresh_database(name: str) -> None:
    """Drop and create ``name`` (a ``chamvi_lat_`` database), flush Redis db 10, migrate."""
    assert name.startswith("chamvi_lat_"), name
    take_redis(name)
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    client = redis.Redis.from_url(REDIS_URL)
    lock = client.get(LOCK)
    client.flushdb()
    client.set(LOCK, lock or b"")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--run-syncdb", "-v0", f"--settings={SETTINGS}"],
        cwd=ROOT,
        env=env(name, 0),
        check=True,
    )


def drop_database(name: str) -> None:
    assert name.startswith("chamvi_lat_"), name
    release_redis()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cpu_ms(pid: int) -> float:
    """utime + stime of ``pid`` so far, in milliseconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Process:
    def __init__(self, name: str, args: list[str], environ: dict[str, str]) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"chamvi-lat-{name}-", suffix=".log")[1])
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
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
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


class ModelServer(Process):
    def __init__(self, port: int, *options: str) -> None:
        self.port = port
        args = [sys.executable, "-m", "bench.latency.model_server", "--port", str(port), *options]
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
    def __init__(self, environ: dict[str, str], index: int) -> None:
        super().__init__(f"worker{index}", [sys.executable, "manage.py", "rqworker", "chamvi"], environ)

    def ready(self) -> bool:
        return "Listening on" in self.output()


def start_workers(count: int, environ: dict[str, str], first: int = 0) -> list[Worker]:
    workers = [Worker(environ, first + n) for n in range(count)]
    wait_for(lambda: all(w.ready() or not w.alive() for w in workers), 60 + 3 * count, "workers to listen")
    dead = [w for w in workers if not w.alive()]
    if dead:
        raise RuntimeError(f"a worker died at start:\n{dead[0].output()[-3000:]}")
    return workers


class Ticker(Process):
    """``manage.py chamvi_tick`` looping at its default interval, as a deployment runs it."""

    def __init__(self, environ: dict[str, str], interval: float | None = None) -> None:
        extra = ["--interval", str(interval)] if interval is not None else []
        super().__init__("tick", [sys.executable, "manage.py", "chamvi_tick", *extra], environ)
