"""The figures of one invocation, as a few lines of text or one JSON line."""

from __future__ import annotations

import json
from typing import Any

from .phase import Batch


def figures(config: dict[str, Any], baseline: Batch, batch: Batch, max_connections: int) -> dict[str, Any]:
    completed = batch.statuses.get("completed", 0)
    failed = batch.statuses.get("failed", 0)
    return {
        "config": config,
        "wall_s": batch.wall_s,
        "baseline_wall_s": baseline.wall_s,
        "ratio": round(batch.wall_s / baseline.wall_s, 3) if baseline.wall_s else None,
        "completed": completed,
        "failed": failed,
        "other": batch.runs - completed - failed,
        "text_ok": batch.text_ok,
        "ok": completed == batch.runs and batch.text_ok == batch.runs and not batch.timed_out,
        "connections_max": batch.connections_max,
        "max_connections": max_connections,
        "cpu_per_run_ms": batch.cpu_per_run_ms,
        "batch": batch.as_dict(),
        "baseline": baseline.as_dict(),
    }


def text(result: dict[str, Any]) -> str:
    c = result["config"]
    b = result["batch"]
    lines = [
        f"{c['runs']} runs, {c['workers']} worker(s) x CONCURRENCY {c['concurrency']}, pool {c['pool']}, "
        f"think {c['think']} s, {c['chunks']} chunks",
        f"  wall (first start_run -> last finished_at): {result['wall_s']:.2f} s; one run alone: "
        f"{result['baseline_wall_s']:.2f} s; ratio {result['ratio']}",
        f"  completed / failed / other: {result['completed']} / {result['failed']} / {result['other']}"
        f"  (statuses {b['statuses']}, errors {b['errors'] or '-'}{', TIMED OUT' if b['timed_out'] else ''})",
        f"  stored llm text equal to the script: {result['text_ok']} / {c['runs']}; "
        f"attempts {b['attempts']}; "
        f"model calls per run {b['model_calls']}; model requests {b['model_requests']}, "
        f"peak concurrent streams at the model {b['model_peak_streams']}",
        f"  creating the runs took {b['create_s']:.2f} s, the last finished {b['after_last_start_s']:.2f} s "
        f"after; start lag {b['start_lag_s']}; "
        f"run duration {b['duration_s']}",
        f"  worker connections (max sampled): {result['connections_max']} of max_connections "
        f"{result['max_connections']}; worker CPU per run: {result['cpu_per_run_ms']} ms",
    ]
    for w in b["workers"]:
        lines.append(
            f"  worker {w['pid']}: {w['runs']} runs, RSS idle {w['rss_idle_mib']} MiB, "
            f"peak {w['rss_peak_mib']} MiB, {w['rss_per_run_kib']} KiB per concurrent run, "
            f"CPU {w['cpu_s']} s, log lines of note {w['problem_count']}"
        )
        lines.extend(f"      | {line[:300]}" for line in w["problems"])
    lines.append(f"  warm-up runs per worker (before the idle RSS): {c['warmup_runs_per_worker']}")
    lines.append(f"  logs: {c['logs']}; {c['cpus']} CPUs, load average (1 min) {c['loadavg_1m_start_end']}")
    return "\n".join(lines)


def dump(result: dict[str, Any]) -> str:
    return json.dumps(result, default=str)
