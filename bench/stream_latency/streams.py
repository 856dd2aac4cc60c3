"""One round of the stream-latency bench: ``runs`` runs streaming at once through the real path
(model server → rqworker → Redis buffer and channel layer → daphne → websocket), ``streams``
sockets following them (``streams // runs`` or one more per run), every socket subscribed with
``?after=0`` before the model sends its first chunk."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from bench.common import ROOT
from bench.common.latency_resources import REDIS_URL
from bench.common.procstat import cpu_ms, host_cpu, load_average
from bench.common.stack import Daphne, Worker, wait_for
from bench.common.stamping_model import StampingModel
from bench.common.stamps import count
from bench.common.stats import percentile
from bench.stream_latency.clients import ClientGroup, Received


@dataclass
class Stack:
    model: StampingModel
    daphne: Daphne
    workers: list[Worker]
    cookie: str
    user: Any
    client_procs: int
    patience: float
    tap: bool = False


@dataclass
class RoundResult:
    runs: int
    streams: int
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    lost: int
    wrong_text: int
    out_of_order: int
    duplicates: int
    unended: int
    failed_runs: int
    events: int
    deltas: int
    stamps_per_delta: float
    daphne_cpu_ms_per_event: float
    worker_cpu_ms_per_run: float
    seconds: float
    layer_p50_ms: float = float("nan")
    layer_p99_ms: float = float("nan")
    layer_max_ms: float = float("nan")
    repaired: dict[str, int] = field(default_factory=dict)
    host_busy_pct: float = float("nan")
    load_avg: float = float("nan")
    # What a run's replay buffer holds in Redis once it has ended (kept STREAM_BUFFER_SECONDS).
    redis_bytes_per_run: float = float("nan")

    @property
    def clean(self) -> bool:
        return not (self.lost or self.wrong_text or self.out_of_order or self.duplicates or self.unended)


def _create_runs(stack: Stack, runs: int) -> list[str]:
    from chamvi_runs import start_run

    return [start_run("basic", {"tag": f"lat-{n}"}, created_by=stack.user).pk for n in range(runs)]


def _check(run_ids: list[str], received: list[Received]) -> dict[str, int]:
    """Compare what each socket got with the replay buffer (every event recorded) and the stored
    llm step (the text the deltas must join to)."""
    from chamvi_runs.models import Run, Step
    from chamvi_runs.streaming.buffer import event_log

    by_run: dict[str, list[Received]] = defaultdict(list)
    for got in received:
        by_run[got.path.split("/")[4]].append(got)
    found = {"lost": 0, "wrong_text": 0, "failed_runs": 0}
    log = event_log()
    for run_id in run_ids:
        expected = len(log.after(run_id, 0))
        stored = Step.objects.filter(run_id=run_id, kind="llm").values_list("output", flat=True).first()
        text = (stored or {}).get("text", "")
        found["failed_runs"] += Run.objects.get(pk=run_id).status != "completed"
        for got in by_run[run_id]:
            found["lost"] += max(expected - (got.events - got.duplicates), got.gaps, 0)
            found["wrong_text"] += got.text != text
    connection.close()
    return found


class Tap:
    """``bench.stream_latency.tap`` in a process of its own, in the groups of ``run_ids``."""

    def __init__(self, run_ids: list[str], patience: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.stream_latency.tap"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"runs": run_ids, "patience": patience}) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the channel-layer tap failed to start")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def latencies(self) -> list[float]:
        out, _ = self.proc.communicate(timeout=600)
        return list(json.loads(out.strip().splitlines()[-1])["latencies"])


def _drops() -> dict[str, int]:
    """What daphne's consumers had to repair from the replay buffer (the layer lost or delayed it),
    counted in Redis by ``chamvi_runs.web.consumers``."""
    import redis

    from chamvi_runs.web.consumers import DROPS_KEY

    counts = redis.Redis.from_url(REDIS_URL).hgetall(DROPS_KEY)
    return {k.decode(): int(v) for k, v in counts.items()}


def _buffer_bytes(run_ids: list[str]) -> int:
    """Redis's MEMORY USAGE of the runs' replay buffers (sequence, events, regions)."""
    import redis

    from chamvi_runs.streaming.buffer import RedisEventLog

    client = redis.Redis.from_url(REDIS_URL)
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        for key in RedisEventLog._keys(run_id):
            pipe.memory_usage(key, samples=0)
    return sum(size or 0 for size in pipe.execute())


def run_round(stack: Stack, runs: int, streams: int) -> RoundResult:
    from chamvi_runs.core.states import TERMINAL
    from chamvi_runs.models import Run

    stack.model.arm()
    load = load_average()
    drops = _drops()
    pids = [stack.daphne.pid, *(w.pid for w in stack.workers)]
    before = {pid: cpu_ms(pid) or 0.0 for pid in pids}
    run_ids = _create_runs(stack, runs)
    paths = [f"/ws/chamvi/runs/{run_ids[n % runs]}/?after=0" for n in range(streams)]
    clients = ClientGroup(stack.daphne.port, stack.cookie, paths, stack.client_procs, stack.patience)
    tap: Tap | None = None
    try:
        clients.wait_ready()
        tap = Tap(run_ids, stack.patience) if stack.tap else None
        # Every model call waits at the gate: all runs then stream at once.
        wait_for(lambda: stack.model.status()["waiting"] >= runs, 120 + runs, f"{runs} model calls")
        released = {pid: cpu_ms(pid) or 0.0 for pid in pids}
        started = time.monotonic()
        busy0, total0 = host_cpu()
        stack.model.go()
        received = clients.results()
        layer = tap.latencies() if tap else []
        seconds = time.monotonic() - started
        busy1, total1 = host_cpu()
    finally:
        clients.kill()
        if tap is not None:
            tap.kill()
    after = {pid: cpu_ms(pid) or 0.0 for pid in pids}
    terminal = [s.value for s in TERMINAL]
    wait_for(
        lambda: not Run.objects.filter(pk__in=run_ids).exclude(status__in=terminal).exists(),
        120,
        "runs to settle",
    )
    found = _check(run_ids, received)
    repaired = {k: v - drops.get(k, 0) for k, v in _drops().items() if v - drops.get(k, 0)}

    latencies = [ms for got in received for ms in got.latencies]
    events = sum(got.events for got in received)
    deltas = sum(got.deltas for got in received)
    stamps = sum(count(got.text) for got in received)
    daphne = stack.daphne.pid
    worker_ms = sum(after[w.pid] - before[w.pid] for w in stack.workers)
    return RoundResult(
        runs=runs,
        streams=streams,
        samples=len(latencies),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        lost=found["lost"],
        wrong_text=found["wrong_text"],
        out_of_order=sum(got.out_of_order for got in received),
        duplicates=sum(got.duplicates for got in received),
        unended=sum(not got.ended for got in received),
        failed_runs=found["failed_runs"],
        events=events,
        deltas=deltas,
        stamps_per_delta=stamps / deltas if deltas else float("nan"),
        daphne_cpu_ms_per_event=(after[daphne] - released[daphne]) / events if events else float("nan"),
        worker_cpu_ms_per_run=worker_ms / runs,
        seconds=seconds,
        layer_p50_ms=percentile(layer, 50),
        layer_p99_ms=percentile(layer, 99),
        layer_max_ms=max(layer, default=float("nan")),
        repaired=repaired,
        host_busy_pct=100 * (busy1 - busy0) / max(1.0, total1 - total0),
        load_avg=load,
        redis_bytes_per_run=_buffer_bytes(run_ids) / runs,
    )
