"""The bench's figures as tables: medians with their spread over the repetitions, and the ratios to
the two ceilings, each computed inside one repetition (systems are interleaved in it)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

Cell = dict[str, Any]
DASH, MINUS = "\u2013", "\u2212"  # typographic, as the docs print them

TITLES = {
    "bare": "bare openai calls (ceiling 1)",
    "rawsql": "raw SQL writes (ceiling 2)",
    "langgraph": "LangGraph + PostgresSaver",
    "dbos": "DBOS workflow",
    "chamvi": "chamvi_runs (start_run → RQ → rqworker)",
}

COLUMNS: list[tuple[str, str, int]] = [  # key, heading, decimals
    ("runs_per_s", "runs/s", 1),
    ("worker_cpu_ms", "worker CPU ms/run", 1),
    ("pg_cpu_ms", "PG backend CPU ms/run", 1),
    ("commits", "commits/run", 1),
    ("stored_bytes", "stored B/run", 0),
    ("disk_bytes", "disk B/run", 0),
]


def spread(values: list[float]) -> tuple[float, float, float] | None:
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def _number(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def fmt(stats: tuple[float, float, float] | None, decimals: int) -> str:
    if stats is None:
        return DASH
    median, low, high = stats
    if len({round(median, decimals), round(low, decimals), round(high, decimals)}) == 1:
        return _number(median, decimals)
    return f"{_number(median, decimals)} ({_number(low, decimals)}{DASH}{_number(high, decimals)})"


def systems_in(cells: list[Cell]) -> list[str]:
    return list(dict.fromkeys(cell["system"] for cell in cells))


def summary(cells: list[Cell]) -> dict[str, dict[str, tuple[float, float, float] | None]]:
    """Per system and figure: (median, min, max) over the repetitions."""
    out: dict[str, dict[str, tuple[float, float, float] | None]] = {}
    for system in systems_in(cells):
        mine = [cell for cell in cells if cell["system"] == system]
        keys = [key for key, _, _ in COLUMNS] + ["producer_cpu_ms", "model_cpu_ms"]
        out[system] = {key: spread([c[key] for c in mine if c.get(key) is not None]) for key in keys}
    return out


def _per_rep(
    cells: list[Cell], system: str, ceiling: str, combine: Callable[[Cell, Cell], float | None]
) -> list[float]:
    values = []
    for cell in cells:
        if cell["system"] != system:
            continue
        base = next((c for c in cells if c["system"] == ceiling and c["rep"] == cell["rep"]), None)
        if base is not None and (value := combine(cell, base)) is not None:
            values.append(value)
    return values


def ratios(cells: list[Cell]) -> dict[str, dict[str, tuple[float, float, float] | None]]:
    """Per system: runs/s ÷ bare, worker CPU minus bare (ms/run), stored bytes ÷ raw SQL."""
    out = {}
    for system in systems_in(cells):
        model_side = system not in ("bare", "rawsql")
        out[system] = {
            "speed": spread(
                _per_rep(cells, system, "bare", lambda c, b: c["runs_per_s"] / b["runs_per_s"])
                if model_side
                else []
            ),
            "cpu": spread(
                _per_rep(cells, system, "bare", lambda c, b: c["worker_cpu_ms"] - b["worker_cpu_ms"])
                if model_side
                else []
            ),
            "bytes": spread(
                _per_rep(
                    cells,
                    system,
                    "rawsql",
                    lambda c, b: (
                        c["stored_bytes"] / b["stored_bytes"]
                        if c.get("stored_bytes") and b.get("stored_bytes")
                        else None
                    ),
                )
                if system != "rawsql"
                else []
            ),
        }
    return out


def _decimals(key: str, stats: tuple[float, float, float] | None, default: int) -> int:
    # Paced runs take seconds each: 0.36 and 0.34 runs/s must not both print as 0.4.
    return 2 if key == "runs_per_s" and stats is not None and stats[0] < 10 else default


def table(cells: list[Cell]) -> str:
    stats = summary(cells)
    head = "| system | " + " | ".join(heading for _, heading, _ in COLUMNS) + " |"
    rows = [head, "|" + " --- |" * (len(COLUMNS) + 1)]
    for system, figures in stats.items():
        values = [fmt(figures[key], _decimals(key, figures[key], decimals)) for key, _, decimals in COLUMNS]
        rows.append(f"| {TITLES.get(system, system)} | " + " | ".join(values) + " |")
    return "\n".join(rows)


def ratio_table(cells: list[Cell]) -> str:
    rows = [
        f"| system | runs/s ÷ bare | worker CPU {MINUS} bare, ms/run | stored bytes ÷ raw SQL |",
        "| --- | --- | --- | --- |",
    ]
    for system, figures in ratios(cells).items():
        rows.append(
            f"| {TITLES.get(system, system)} | {fmt(figures['speed'], 2)} | {fmt(figures['cpu'], 1)}"
            f" | {fmt(figures['bytes'], 2)} |"
        )
    return "\n".join(rows)


def side_table(cells: list[Cell]) -> str:
    """The CPU spent beside the worker: chamvi's producer, and the scripted model of every system."""
    rows = ["| system | producer CPU ms/run | scripted model CPU ms/run |", "| --- | --- | --- |"]
    for system, figures in summary(cells).items():
        rows.append(
            f"| {TITLES.get(system, system)} | {fmt(figures['producer_cpu_ms'], 1)}"
            f" | {fmt(figures['model_cpu_ms'], 1)} |"
        )
    return "\n".join(rows)
