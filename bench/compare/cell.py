"""One cell of the bench: one system, one repetition. Starts the scripted model and the system's
driver (in the system's venv), and takes the measurements around the driver's measured window."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.common import ROOT
from bench.common.pgstats import Server, dsn
from bench.common.procstat import cpu_ms
from bench.compare import venvs


@dataclass(frozen=True)
class SystemSpec:
    name: str
    venv: str  # a name of venvs.py; "project" for the project's own .venv
    module: str  # bench.compare.systems.<module>
    database: bool  # whether it writes to PostgreSQL


SYSTEMS: dict[str, SystemSpec] = {
    spec.name: spec
    for spec in (
        SystemSpec("bare", "project", "bare", False),
        SystemSpec("rawsql", "project", "rawsql", True),
        SystemSpec("langgraph", "langgraph", "langgraph_sys", True),
        SystemSpec("dbos", "dbos", "dbos_sys", True),
        SystemSpec("chamvi", "project", "chamvi_sys", True),
    )
}


@dataclass
class Settings:
    runs: int
    warmup: int
    pacing: str
    db_prefix: str
    redis_url: str
    settle_seconds: float
    log_dir: Path
    concurrency: int | None


class Lines:
    """A child's stdout, one JSON line at a time, with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.queue.put(line)
        self.queue.put(None)

    def next(self, timeout: float, what: str, log: Path) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {what} within {timeout:.0f} s; see {log}") from None
            if line is None:
                raise RuntimeError(f"the process ended before {what}:\n{_tail(log)}")
            if line.startswith("{"):
                return dict(json.loads(line))


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _stop(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _spawn(
    python: Path, args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(python), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env=env,
    )


def measure(spec: SystemSpec, rep: int, settings: Settings, server: Server) -> dict[str, Any]:
    import os

    label = f"{spec.name}-{settings.pacing}-rep{rep}"
    database = settings.db_prefix + spec.name
    model_log = settings.log_dir / f"model-{label}.log"
    driver_log = settings.log_dir / f"driver-{label}.log"
    model = _spawn(venvs.PROJECT_PYTHON, ["-m", "bench.compare.workload_model"], model_log)
    try:
        assert model.stdout is not None
        model_url = str(Lines(model.stdout).next(30, "the model server's address", model_log)["base_url"])
        cfg = {
            "dsn": dsn(database),
            "base_url": model_url,
            "model": f"bench-{settings.pacing}",
            "pacing": settings.pacing,
            "runs": settings.runs,
            "warmup": settings.warmup,
            "redis_url": settings.redis_url,
            "log_dir": str(settings.log_dir),
            "label": label,
        }
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if settings.concurrency:
            env["CHAMVI_CONCURRENCY"] = str(settings.concurrency)
        driver = _spawn(
            venvs.python_for(spec.venv),
            ["-m", f"bench.compare.systems.{spec.module}", json.dumps(cfg)],
            driver_log,
            env,
        )
        try:
            assert driver.stdout is not None and driver.stdin is not None
            lines = Lines(driver.stdout)
            lines.next(300 + 10 * settings.warmup, "ready", driver_log)
            live_before = disk_before = 0
            if spec.database:
                live_before, disk_before = server.stored(database)
            # Idle backends publish their statistics up to 10 s late: the warm-up's must be in.
            time.sleep(settings.settle_seconds)
            commits_before = server.commits(database) if spec.database else 0
            backends_before = server.backend_cpu(database) if spec.database else {}
            model_before = cpu_ms(model.pid) or 0.0
            driver.stdin.write("go\n")
            driver.stdin.flush()
            per_run_limit = 4.0 if settings.pacing == "paced" else 1.0
            done = lines.next(120 + per_run_limit * 10 * settings.runs, "done", driver_log)
            backends_after = server.backend_cpu(database) if spec.database else {}
            model_after = cpu_ms(model.pid) or 0.0
            _stop(driver)
            if driver.returncode:
                raise RuntimeError(f"{spec.name} exited {driver.returncode}:\n{_tail(driver_log)}")
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)
    finally:
        _stop(model, 10)
    commits = live = disk = 0
    if spec.database:
        server.wait_for_no_backends(database)
        commits = server.commits(database) - commits_before - int(done.get("own_commits", 0))
        live_after, disk_after = server.stored(database)
        live, disk = live_after - live_before, disk_after - disk_before
    # A backend that began inside the window counts whole; one that ended inside it is missed.
    pg_cpu = sum(after - backends_before.get(pid, 0.0) for pid, after in backends_after.items())
    runs = int(done["runs"])
    return {
        "system": spec.name,
        "rep": rep,
        "pacing": settings.pacing,
        "runs": runs,
        "wall_s": done["wall_s"],
        "runs_per_s": runs / done["wall_s"],
        "worker_cpu_ms": done["worker_cpu_ms"] / runs,
        "producer_cpu_ms": done["driver_cpu_ms"] / runs if spec.name == "chamvi" else None,
        "pg_cpu_ms": pg_cpu / runs if spec.database else None,
        "model_cpu_ms": (model_after - model_before) / runs,
        "commits": commits / runs if spec.database else None,
        "stored_bytes": live / runs if spec.database else None,
        "disk_bytes": disk / runs if spec.database else None,
        "loadavg": os.getloadavg()[0],
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
