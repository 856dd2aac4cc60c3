"""Time from SIGKILL of a worker to its run's recovery, at chamvi_runs' default settings.

Real processes: a paced model server (``--reply-seconds`` of text, then a tool call; the second model
call answers at once), two ``manage.py rqworker chamvi`` (A executes the run, B idles) and the
janitor as a deployment runs it (``manage.py chamvi_tick``, looping at its default interval; the
workers do not run it themselves). SIGKILL A mid-stream, then poll the database every 20 ms for:
(a) the run re-claimed (attempt grows, a claim owner is set), (b) its next step row written,
(c) the run completed. A replacement worker is started after each repetition.

    .venv/bin/python -m bench.recovery --repeat 5
    .venv/bin/python -m bench.recovery --repeat 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from bench.common import latency_resources as res
from bench.common.stack import Process, Ticker, start_workers
from bench.common.stamping_model import StampingModel
from bench.common.stats import median, table
from bench.recovery.rounds import Recovery, recover_once

MODEL_PORT = 8872
DEFAULT_TICK_INTERVAL = 5.0  # manage.py chamvi_tick --interval's default


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reply-seconds", type=float, default=6.0, help="length of the slow model reply")
    parser.add_argument(
        "--tick-interval", type=float, default=None, help="chamvi_tick --interval (default: its own)"
    )
    parser.add_argument("--lease-seconds", type=float, default=None, help="override LEASE_SECONDS")
    parser.add_argument("--heartbeat-seconds", type=float, default=None, help="override HEARTBEAT_SECONDS")
    parser.add_argument("--database", default="chamvi_lat_recovery")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of tables")
    return parser.parse_args()


def setup_django(args: argparse.Namespace) -> dict[str, float]:
    """Django for this process; the settings in force, as the workers and the janitor see them."""
    if args.lease_seconds is not None:
        os.environ["CHAMVI_BENCH_LEASE_SECONDS"] = str(args.lease_seconds)
    if args.heartbeat_seconds is not None:
        os.environ["CHAMVI_BENCH_HEARTBEAT_SECONDS"] = str(args.heartbeat_seconds)
    os.environ.update(res.env(args.database, MODEL_PORT))
    import django

    django.setup()
    from chamvi_runs.conf import conf

    return {
        "LEASE_SECONDS": conf.LEASE_SECONDS,
        "HEARTBEAT_SECONDS": conf.HEARTBEAT_SECONDS,
        "CANCEL_POLL_SECONDS": conf.CANCEL_POLL_SECONDS,
        "tick_interval": args.tick_interval if args.tick_interval is not None else DEFAULT_TICK_INTERVAL,
    }


def main() -> None:
    args = parse()
    res.fresh_database(args.database)
    settings = setup_django(args)
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("bench", "bench@example.com", "bench")
    environ = res.env(args.database, MODEL_PORT)
    chunks = int(args.reply_seconds / 0.02)
    procs: list[Process] = []
    results: list[Recovery] = []
    try:
        model = StampingModel(MODEL_PORT, "--tool-first", "--chunks", str(chunks), "--pace", "0.02")
        procs.append(model)
        procs.append(Ticker(environ, args.tick_interval))
        workers = start_workers(2, environ)
        procs.extend(workers)
        for n in range(args.repeat):
            result = recover_once(user, model, workers, args.reply_seconds, timeout=300)
            print(
                f"#{n + 1}: reclaimed {result.reclaim_s:.2f} s, next step {result.next_step_s:.2f} s, "
                f"completed {result.completed_s:.2f} s after the kill ({result.status})",
                file=sys.stderr,
                flush=True,
            )
            results.append(result)
            replacement = start_workers(1, environ, first=2 + n)
            workers.extend(replacement)
            procs.extend(replacement)
    finally:
        for proc in reversed(procs):
            proc.stop()
        if not args.keep_db:
            res.drop_database(args.database)
        res.release_redis()
    output(args, settings, results)


def output(args: argparse.Namespace, settings: dict[str, float], results: list[Recovery]) -> None:
    figures = {
        name: {
            "median_s": median([getattr(r, name) for r in results]),
            "min_s": min(getattr(r, name) for r in results),
            "max_s": max(getattr(r, name) for r in results),
        }
        for name in ("reclaim_s", "next_step_s", "completed_s")
    }
    # A dead worker's lease runs out LEASE - (time since its last renewal) after the kill, and the
    # janitor's next pass comes within one interval after that; B dequeues at once.
    lease, beat, tick = settings["LEASE_SECONDS"], settings["HEARTBEAT_SECONDS"], settings["tick_interval"]
    bound = {"reclaim_min_s": lease - beat, "reclaim_max_s": lease + tick}
    if args.json:
        print(
            json.dumps(
                {
                    "settings": settings,
                    "expected": bound,
                    "figures": figures,
                    "runs": [asdict(r) for r in results],
                }
            )
        )
        return
    print(
        f"settings: {settings}; expected re-claim between {bound['reclaim_min_s']:.0f} and "
        f"{bound['reclaim_max_s']:.0f} s after the kill (lease - heartbeat .. lease + tick)"
    )
    rows = [
        [
            n + 1,
            r.kill_after_claim_s,
            r.reclaim_s,
            r.next_step_s,
            r.completed_s,
            r.attempts,
            r.reclaimed_by_other,
            r.status,
        ]
        for n, r in enumerate(results)
    ]
    print(
        table(
            [
                "#",
                "kill after claim s",
                "reclaim s",
                "next step s",
                "completed s",
                "attempts",
                "other worker",
                "status",
            ],
            rows,
            digits=2,
        )
    )
    print()
    print(
        table(
            ["from the kill to", "median s", "min s", "max s"],
            [
                [name.removesuffix("_s").replace("_", " "), f["median_s"], f["min_s"], f["max_s"]]
                for name, f in figures.items()
            ],
            digits=2,
        )
    )


if __name__ == "__main__":
    main()
