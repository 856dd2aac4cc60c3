"""Many concurrent runs on a few worker processes, measured for real.

    .venv/bin/python -m bench.concurrency [--runs 200 --workers 2 --concurrency 100 --pool 10 --think 10]
    .venv/bin/python -m bench.concurrency --runs 20 --think 2      # quick
    .venv/bin/python -m bench.concurrency --json                    # one JSON line of the figures

A scripted model thinks ``--think`` seconds before it streams a short answer, so runs share waiting,
not CPU. W ``manage.py rqworker chamvi`` processes (CHAMVI_CONCURRENCY=C, a pool of P connections
each) execute first one run alone (the baseline), then N runs started at once; the bench reports
both wall times, their ratio, what the runs stored, and what the workers spent (RSS, CPU,
PostgreSQL connections). Its own database ``chamvi_conc_bench`` (created and migrated) and Redis
db 8 (flushed); its processes are gone when it ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.common.scripted_model import ScriptedModel
from bench.common.stack import Worker, start_workers
from bench.concurrency import resources


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100, help="CHAMVI_CONCURRENCY of each worker")
    parser.add_argument("--pool", type=int, default=10, help="connection pool size of each worker (0: none)")
    parser.add_argument("--think", type=float, default=10.0, help="seconds before the model's first chunk")
    parser.add_argument("--chunks", type=int, default=20, help="text chunks of the answer")
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between the answer's chunks")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for a batch")
    parser.add_argument("--json", action="store_true", help="print one JSON line of the figures")
    return parser.parse_args()


def setup_django() -> None:
    # The driver starts runs and reads them: no pool, its own application_name (not counted).
    os.environ.update(
        DJANGO_SETTINGS_MODULE=resources.SETTINGS,
        DATABASE_URL=resources.database_url(app="chamvi-bench-conc-driver"),
        REDIS_URL=resources.REDIS_URL,
        OPENAI_API_KEY="bench",
    )
    import django

    django.setup()


def main() -> int:
    args = parse()
    load_start = round(os.getloadavg()[0], 2)
    resources.ensure_database()
    resources.flush_redis()
    setup_django()
    from django.core.management import call_command

    from bench.concurrency import figures
    from bench.concurrency.phase import run_batch
    from bench.concurrency.thinking_model import WARMUP, answer

    call_command("flush", interactive=False, verbosity=0)  # the previous invocation's runs
    logs = Path(tempfile.mkdtemp(prefix="chamvi-conc-bench-"))
    timeout = args.timeout or 3 * args.think + 60 + args.runs * 0.5
    expected = answer(args.chunks)
    think = ["--think", str(args.think), "--chunks", str(args.chunks), "--gap", str(args.gap)]
    server = ScriptedModel("bench.concurrency.thinking_model", *think)
    workers: list[Worker] = []
    try:
        env = resources.worker_env(
            resources.database_url(args.pool or None), server.base_url, args.concurrency
        )
        # SIGTERM drains a worker: nothing of ours runs by then, but its threads may take a while.
        workers = start_workers(args.workers, env, logs=logs, grace=40)
        # Every worker executes a run before anything is measured, so that its idle RSS is warm.
        warmed = [0] * len(workers)
        for _ in range(5):  # which worker takes a job is RQ's choice: again until each had one
            warmup = run_batch(2 * args.workers, workers, server, expected, timeout, label=WARMUP)
            warmed = [done + w.runs for done, w in zip(warmed, warmup.workers, strict=True)]
            if all(warmed):
                break
        baseline = run_batch(1, workers, server, expected, timeout)
        batch = run_batch(args.runs, workers, server, expected, timeout)
    finally:
        for worker in workers:
            worker.stop()
        server.stop()
        resources.flush_redis()
    config = {
        key: getattr(args, key)
        for key in ("runs", "workers", "concurrency", "pool", "think", "chunks", "gap")
    }
    config["logs"] = str(logs)
    config["warmup_runs_per_worker"] = warmed
    # The machine may be shared: its load says how far the CPU figures are this bench's own.
    config["cpus"] = os.cpu_count()
    config["loadavg_1m_start_end"] = [load_start, round(os.getloadavg()[0], 2)]
    result = figures.figures(config, baseline, batch, resources.max_connections())
    print(figures.dump(result) if args.json else figures.text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
