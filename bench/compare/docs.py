"""docs/benchmarks.md, written from one run of ``python -m bench.compare``."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from bench.compare import tables, workload
from chamvi_runs.conf import DEFAULTS

SECTIONS = Path(__file__).with_name("doc_sections.md")


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}"


def _packages(packages: dict[str, dict[str, str]]) -> str:
    names = {
        "project": "project venv (bare, rawsql, chamvi)",
        "langgraph": "LangGraph venv",
        "dbos": "DBOS venv",
        "report": "chart venv",
    }
    return "\n".join(
        f"- {names.get(venv, venv)}: "
        + ", ".join(f"{name} {version}" for name, version in sorted(found.items()))
        for venv, found in packages.items()
    )


def write_doc(data: dict[str, Any], path: Path, chart: Path | None) -> Path:
    cells = data["cells"]
    concurrency = data.get("concurrency") or f"{DEFAULTS['CONCURRENCY']} (the default)"
    loads = [cell["loadavg"] for cell in cells] or [0.0]
    reps = f"{data['reps']} repetition" + ("s" if data["reps"] != 1 else "")
    parts = [
        "# Benchmarks: chamvi_runs beside its peers",
        "",
        f"Written by `make bench` (bench/compare/) on {data['date']}: {data['pacing']} pacing, "
        f"{reps}, {data['runs']} runs per system per repetition, systems interleaved "
        f"inside each repetition; {data['minutes']:.0f} minutes in all, 1-minute load average "
        f"{min(loads):.1f}{tables.DASH}{max(loads):.1f} at the cells' ends. Figures are medians, with "
        f"min{tables.DASH}max over the repetitions in parentheses. Everything runs on one machine, "
        "against a local scripted model: the numbers are the systems' own costs, which a real model's "
        "latency would dwarf. Read "
        "ratios rather than absolute times: the machine is shared and its speed drifts.",
        "",
        f"**Machine**: {machine()}; Python {platform.python_version()}; PostgreSQL {data['postgres']} "
        f"(`synchronous_commit` on); Redis {data['redis']}; chamvi worker concurrency: {concurrency}.",
        "",
        "**Packages**:",
        "",
        _packages(data["packages"]),
        "",
        "## Results",
        "",
        tables.table(cells),
        "",
        "Against the ceilings, per repetition:",
        "",
        tables.ratio_table(cells),
        "",
        "CPU beside the worker (chamvi's producer runs `start_run` and watches for the runs to settle):",
        "",
        tables.side_table(cells),
        "",
    ]
    if chart is not None:
        parts += [f"![The table as a chart]({chart.name})", ""]
    sections = SECTIONS.read_text().split("\n", 1)[1]  # without its comment
    parts.append(sections.format(final=len(workload.FINAL_TEXT), chunk=workload.CHUNK, warmup=data["warmup"]))
    path.write_text("\n".join(parts))
    return path
