"""The chart of docs/benchmarks.png, drawn by matplotlib from the bench's cells; runs in the bench's
``report`` venv (matplotlib is no dependency of the project):

    python -m bench.compare.chart cells.json benchmarks.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.compare.tables import summary

PANELS = [
    ("runs_per_s", "runs/s (one worker process; log scale)"),
    ("worker_cpu_ms", "CPU ms per run: worker (+ PG backends, hatched)"),
    ("commits", "commits per run"),
    ("stored_bytes", "stored bytes per run (live rows)"),
]
COLORS = {
    "bare": "#9e9e9e",
    "rawsql": "#bdbdbd",
    "langgraph": "#1f77b4",
    "dbos": "#2ca02c",
    "chamvi": "#d62728",
}


def main(cells_path: str, png_path: str) -> None:
    with open(cells_path) as handle:
        data = json.load(handle)
    stats = summary(data["cells"])
    systems = list(stats)
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    for axis, (key, title) in zip(axes.flat, PANELS, strict=True):
        shown = [s for s in systems if stats[s][key] is not None]
        medians = [stats[s][key][0] for s in shown]  # type: ignore[index]
        errors = [
            [stats[s][key][0] - stats[s][key][1] for s in shown],  # type: ignore[index]
            [stats[s][key][2] - stats[s][key][0] for s in shown],  # type: ignore[index]
        ]
        colors = [COLORS.get(s, "#555555") for s in shown]
        axis.bar(shown, medians, yerr=errors, color=colors, capsize=4)
        if key == "worker_cpu_ms":
            pg = [(stats[s]["pg_cpu_ms"] or (0.0, 0, 0))[0] for s in shown]
            axis.bar(shown, pg, bottom=medians, color=colors, alpha=0.4, hatch="//", edgecolor="black")
        if key == "runs_per_s":
            axis.set_yscale("log")  # raw SQL, with no model, is an order of magnitude above the rest
        axis.set_title(title, fontsize=10)
        axis.tick_params(axis="x", labelsize=9)
        axis.grid(axis="y", alpha=0.3)
    pacing = data["cells"][0]["pacing"] if data["cells"] else ""
    figure.suptitle(
        f"chamvi_runs beside its peers: {data.get('date', '')}, {pacing} pacing, "
        f"median and min-max of {data.get('reps', '?')} repetitions",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
