"""chamvi_runs beside its peers, on one workload: ``make bench``.

    make bench                                   # 3 repetitions, all five systems, instant pacing
    .venv/bin/python -m bench.compare --systems bare,chamvi --reps 1 --runs 20
    .venv/bin/python -m bench.compare --paced --reps 1   # 20 ms before every chunk
    .venv/bin/python -m bench.compare --smoke            # bare + chamvi, 1 rep, 3 runs (tests)

Systems are interleaved inside every repetition (rep 1: every system, rep 2: every system, ...),
so drifting machine load spreads over all of them. Each system runs in a process of its own (in
its own venv, made under $CHAMVI_BENCH_HOME on first use) against a scripted model process of its
own, and writes to a PostgreSQL database of its own, re-created at the start. Writes
benchmarks.md and benchmarks.png to --out-dir (docs/ for instant pacing) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.common import ROOT
from bench.common.pgstats import Server
from bench.compare import tables, venvs
from bench.compare.cell import SYSTEMS, Settings, measure
from bench.compare.docs import write_doc


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS)
    )
    parser.add_argument("--reps", type=int, help="repetitions (default 3; 1 with --smoke)")
    parser.add_argument(
        "--runs", type=int, help="runs per system per repetition (default 100; 20 paced; 3 smoke)"
    )
    parser.add_argument("--warmup", type=int, help="unmeasured runs before each measured batch (default 3)")
    parser.add_argument("--paced", action="store_true", help="20 ms before every streamed chunk")
    parser.add_argument("--smoke", action="store_true", help="bare and chamvi, 1 rep, 3 runs, no chart")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG (and its matplotlib venv)")
    parser.add_argument(
        "--out-dir", type=Path, help="where benchmarks.md/png go (default docs/; paced: bench home)"
    )
    parser.add_argument("--db-prefix", default="chamvi_bench_peer_", help="databases are <prefix><system>")
    parser.add_argument(
        "--redis-db", type=int, default=12, help="Redis db of chamvi's queue and channel layer"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        help="wait between warm-up and the measured window, for PostgreSQL's statistics (default 11)",
    )
    parser.add_argument("--chamvi-concurrency", type=int, help="CHAMVI_RUNS['CONCURRENCY'] of the worker")
    parser.add_argument("--from-cells", type=Path, help="measure nothing: write the docs from a cells-*.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.systems = args.systems if "--systems" in (argv or sys.argv) else "bare,chamvi"
        args.no_chart = True
    defaults = {
        "reps": 1 if args.smoke else 3,
        "runs": 3 if args.smoke else (20 if args.paced else 100),
        "warmup": 1 if args.smoke else 3,
        "settle_seconds": 1.0 if args.smoke else 11.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    if args.out_dir is None:
        args.out_dir = venvs.home() if args.paced else ROOT / "docs"
    return args


def redis_url(db: int) -> str:
    """REDIS_URL's server (the tests' convention) with the bench's own db."""
    parts = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def prepare(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    """Venvs made, databases re-created, Redis db flushed; the versions the report names."""
    import redis

    wanted = (
        {"project"} | {SYSTEMS[name].venv for name in args.systems} | (set() if args.no_chart else {"report"})
    )
    versions = {name: venvs.versions(name) for name in sorted(wanted)}  # makes missing venvs first
    for name in args.systems:
        if SYSTEMS[name].database:
            server.recreate(args.db_prefix + name)
    client = redis.Redis.from_url(redis_url(args.redis_db))
    client.flushdb()
    redis_version = str(client.info("server")["redis_version"])
    client.close()
    return {"packages": versions, "redis": redis_version, "postgres": server.version()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell, interleaved: rep 1 of every system, then rep 2, ..."""
    pacing = "paced" if args.paced else "instant"
    log_dir = venvs.home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        runs=args.runs,
        warmup=args.warmup,
        pacing=pacing,
        db_prefix=args.db_prefix,
        redis_url=redis_url(args.redis_db),
        settle_seconds=args.settle_seconds,
        log_dir=log_dir,
        concurrency=args.chamvi_concurrency,
    )
    server = Server()
    started = time.monotonic()
    try:
        meta = prepare(args, server)
        cells: list[dict[str, Any]] = []
        for rep in range(1, args.reps + 1):
            for name in args.systems:
                cell = measure(SYSTEMS[name], rep, settings, server)
                cells.append(cell)
                print(
                    f"rep {rep} {name:<9} {cell['runs_per_s']:7.2f} runs/s"
                    f"  worker {cell['worker_cpu_ms']:6.1f} ms/run  commits/run {cell['commits']}",
                    flush=True,
                )
    finally:
        server.close()
    return {
        **meta,
        "date": time.strftime("%Y-%m-%d"),
        "reps": args.reps,
        "runs": args.runs,
        "warmup": args.warmup,
        "pacing": pacing,
        "systems": args.systems,
        "concurrency": args.chamvi_concurrency,
        "minutes": (time.monotonic() - started) / 60,
        "cells": cells,
    }


def publish(data: dict[str, Any], args: argparse.Namespace, cells_path: Path) -> None:
    """The chart (in the report venv), the markdown, and the tables on stdout."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    chart = None
    if not args.no_chart:
        import subprocess

        chart = args.out_dir / "benchmarks.png"
        python = str(venvs.python_for("report"))
        subprocess.run(
            [python, "-m", "bench.compare.chart", str(cells_path), str(chart)], cwd=ROOT, check=True
        )
    doc = write_doc(data, args.out_dir / "benchmarks.md", chart)
    print()
    print(tables.table(data["cells"]))
    print()
    print(tables.ratio_table(data["cells"]))
    print(f"\nwrote {doc}" + (f" and {chart}" if chart else "") + f"; cells in {cells_path}")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.from_cells:
        cells_path = args.from_cells
        data = json.loads(cells_path.read_text())
    else:
        data = run(args)
        cells_path = venvs.home() / f"cells-{data['pacing']}.json"
        cells_path.parent.mkdir(parents=True, exist_ok=True)
        cells_path.write_text(json.dumps(data, indent=1))
    publish(data, args, cells_path)


if __name__ == "__main__":
    main()
