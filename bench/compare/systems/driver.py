"""What every system's driver shares: the conversation with bench/compare/ (cell.py) over stdin/stdout.

A driver is started as ``python -m bench.compare.systems.<name> '<json>'`` from the repository's root, with
one JSON argument (``dsn``, ``base_url``, ``model``, ``runs``, ``warmup``,
plus system-specific keys), sets itself up and runs ``warmup`` runs, prints ``{"ready": ...}``, waits
for ``go`` on stdin, runs ``runs`` runs, prints ``{"done": ...}`` and exits when stdin closes. The
orchestrator takes its database snapshots between those lines, so set-up and warm-up stay outside
the measured window. Standard library only: every venv imports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Protocol

from bench.common.procstat import cpu_ms


class System(Protocol):
    worker_pid: int
    """The process that executes the runs (the driver itself, or chamvi's rqworker)."""

    def run_batch(self, runs: int) -> dict[str, Any]:
        """Execute ``runs`` runs as the system naturally does; extra figures to report."""
        ...

    def verify(self) -> None:
        """Raise unless every run of the batch ended with the workload's final answer."""
        ...

    def close(self) -> None: ...


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def config() -> dict[str, Any]:
    return dict(json.loads(sys.argv[1]))


def serve(system: System, cfg: dict[str, Any]) -> None:
    try:
        if cfg["warmup"]:
            system.run_batch(cfg["warmup"])
        emit({"ready": True, "worker_pid": system.worker_pid})
        if sys.stdin.readline().strip() != "go":
            return
        worker_before, driver_before = cpu_ms(system.worker_pid), os.times()
        started = time.perf_counter()
        extra = system.run_batch(cfg["runs"])
        wall = time.perf_counter() - started
        worker_after, driver_after = cpu_ms(system.worker_pid), os.times()
        system.verify()
        driver = (driver_after.user + driver_after.system - driver_before.user - driver_before.system) * 1000
        emit(
            {
                "done": True,
                "runs": cfg["runs"],
                "wall_s": wall,
                "worker_cpu_ms": (worker_after or 0.0) - (worker_before or 0.0),
                "driver_cpu_ms": driver,
                **extra,
            }
        )
        sys.stdin.read()  # the orchestrator samples the database's backends, then closes our stdin
    finally:
        system.close()
