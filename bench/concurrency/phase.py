"""One measured batch: N runs started at once from this process, polled in the database until every
one has settled, then checked (statuses, stored text, attempts) and costed (RSS, CPU, connections).
Needs Django set up with the bench's settings."""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common.procstat import cpu_ms, rss_kib
from bench.common.scripted_model import ScriptedModel
from bench.common.stack import Worker
from chamvi_runs import start_run
from chamvi_runs.models import Run, Step

from .sample import Sampler

TERMINAL = ("completed", "failed", "cancelled")
PROBLEM = re.compile(r"Traceback|ERROR|WARNING|CRITICAL|Exception|Error\b|too many clients|timeout", re.I)


@dataclass
class WorkerFigures:
    pid: int
    runs: int
    rss_idle_mib: float
    rss_peak_mib: float
    rss_per_run_kib: float | None
    cpu_s: float
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0


@dataclass
class Batch:
    runs: int
    wall_s: float
    observed_s: float
    create_s: float
    after_last_start_s: float
    statuses: dict[str, int]
    text_ok: int
    attempts: dict[int, int]
    model_calls: dict[int, int]
    start_lag_s: dict[str, float]
    duration_s: dict[str, float]
    connections_max: int
    cpu_per_run_ms: float
    model_requests: int
    model_peak_streams: int
    timed_out: bool
    workers: list[WorkerFigures]
    errors: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _executed_by(worker: Worker, offset: int, pks: set[str]) -> int:
    """Runs of this batch whose job the worker took (RQ logs each job it starts, with its run id)."""
    tail = worker.output()[offset:]
    return sum(1 for pk in pks if pk in tail)


def _problems(worker: Worker, offset: int) -> tuple[int, list[str]]:
    lines = [line for line in worker.output()[offset:].splitlines() if PROBLEM.search(line)]
    return len(lines), lines[:12]


def run_batch(
    n: int, workers: list[Worker], server: ScriptedModel, expected: str, timeout: float, label: str = "run"
) -> Batch:
    """``label`` is the key of each run's payload (the model server answers "warmup" runs at once)."""
    pids = [worker.pid for worker in workers]
    idle = {pid: rss_kib(pid) or 0 for pid in pids}
    cpu_before = {pid: (cpu_ms(pid) or 0.0) / 1000 for pid in pids}
    offsets = {worker.pid: len(worker.output()) for worker in workers}
    requests_before = int(server.stats()["requests"])
    sampler = Sampler(pids).start()

    t0 = time.time()
    started = time.monotonic()
    pks = [start_run("basic", {label: index}).pk for index in range(n)]
    create_s = time.monotonic() - started
    deadline = started + timeout
    timed_out = False
    while Run.objects.filter(pk__in=pks).exclude(status__in=TERMINAL).exists():
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.2)
    observed_s = time.monotonic() - started
    peaks = sampler.stop()
    cpu_after = {pid: (cpu_ms(pid) or 0.0) / 1000 for pid in pids}
    stats = server.stats()

    rows = list(
        Run.objects.filter(pk__in=pks).values(
            "pk", "status", "error_code", "started_at", "finished_at", "attempt", "model_calls"
        )
    )
    texts = {}
    for run_id, output in Step.objects.filter(run_id__in=pks, kind="llm").values_list("run_id", "output"):
        texts.setdefault(run_id, []).append((output or {}).get("text"))
    text_ok = sum(1 for pk in pks if texts.get(pk) == [expected])
    finished = [row["finished_at"].timestamp() for row in rows if row["finished_at"]]
    start_lag = [row["started_at"].timestamp() - t0 for row in rows if row["started_at"]]
    durations = [
        (row["finished_at"] - row["started_at"]).total_seconds()
        for row in rows
        if row["finished_at"] and row["started_at"]
    ]

    pkset = set(pks)
    figures = []
    for worker in workers:
        pid = worker.pid
        runs_here = _executed_by(worker, offsets[pid], pkset)
        peak = peaks.rss_kib.get(pid, idle[pid])
        count, lines = _problems(worker, offsets[pid])
        figures.append(
            WorkerFigures(
                pid=pid,
                runs=runs_here,
                rss_idle_mib=round(idle[pid] / 1024, 1),
                rss_peak_mib=round(peak / 1024, 1),
                rss_per_run_kib=round((peak - idle[pid]) / runs_here, 1) if runs_here else None,
                cpu_s=round(cpu_after[pid] - cpu_before[pid], 2),
                problems=lines,
                problem_count=count,
            )
        )
    cpu_total = sum(cpu_after[pid] - cpu_before[pid] for pid in pids)
    return Batch(
        runs=n,
        wall_s=round(max(finished) - t0, 3) if finished else float("nan"),
        observed_s=round(observed_s, 3),
        create_s=round(create_s, 3),
        # The driver's own pace of starting runs is not the workers': the tail after the last start.
        after_last_start_s=round(max(finished) - t0 - create_s, 3) if finished else float("nan"),
        statuses=dict(Counter(row["status"] for row in rows)),
        text_ok=text_ok,
        attempts=dict(Counter(row["attempt"] for row in rows)),
        model_calls=dict(Counter(row["model_calls"] for row in rows)),
        start_lag_s=_spread(start_lag),
        duration_s=_spread(durations),
        connections_max=peaks.connections,
        cpu_per_run_ms=round(cpu_total * 1000 / n, 1),
        model_requests=int(stats["requests"]) - requests_before,
        model_peak_streams=int(stats["peak"]),
        timed_out=timed_out,
        workers=figures,
        errors=dict(Counter(row["error_code"] for row in rows if row["error_code"])),
    )
