"""Delta latency from the model server's chunk to a websocket client, on loopback, through the real
path: a paced model server process (a 4-character chunk plus its send stamp every 20 ms, 100 chunks),
``manage.py rqworker chamvi`` processes, one ``daphne project.asgi:application`` with Redis, and one
websocket client per run (``?after=0``), in client processes of their own.

Per concurrency level: p50/p99/max of (receive time - send stamp) over every chunk, events lost (seq
gaps, or fewer events than the run's replay buffer recorded), deltas whose joined text differs from
the stored llm step, events out of order, and CPU: daphne ms per delivered event, worker ms per run.
``--find-max`` raises the number of sockets until p99 passes ``--p99-limit`` or an event is lost;
past the runs the workers can execute at once, extra sockets follow the same runs.

    .venv/bin/python -m bench.stream_latency --levels 1,8,50
    .venv/bin/python -m bench.stream_latency --find-max --workers 40 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict

from bench.common import latency_resources as res
from bench.common.stack import Daphne, Process, start_workers
from bench.common.stamping_model import StampingModel
from bench.common.stats import table
from bench.stream_latency.streams import RoundResult, Stack, run_round

MODEL_PORT, DAPHNE_PORT = 8870, 8871


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,50", help="concurrent runs per round (default 1,8,50)")
    parser.add_argument(
        "--find-max", action="store_true", help="raise the socket count until p99 or loss fails"
    )
    parser.add_argument("--find-start", type=int, default=8)
    parser.add_argument(
        "--find-runs",
        type=int,
        default=0,
        help="runs behind the sockets in --find-max (default: all workers can)",
    )
    parser.add_argument("--max-streams", type=int, default=2000)
    parser.add_argument("--p99-limit", type=float, default=20.0, help="ms (default 20)")
    parser.add_argument(
        "--workers", type=int, default=0, help="worker processes (default: enough for the levels)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="CHAMVI_RUNS['CONCURRENCY'] of each worker"
    )
    parser.add_argument("--client-procs", type=int, default=2, help="websocket client processes")
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--pace", type=float, default=0.02, help="seconds before each chunk")
    parser.add_argument(
        "--tap", action="store_true", help="also measure at the channel layer (bench.stream_latency.tap)"
    )
    parser.add_argument("--database", default="chamvi_lat_stream")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of tables")
    return parser.parse_args()


def setup_django(args: argparse.Namespace) -> int:
    """Django for this process, on the bench database; the concurrency the workers will really use."""
    os.environ.update(res.env(args.database, MODEL_PORT))
    if args.concurrency > 1:
        os.environ["CHAMVI_CONCURRENCY"] = str(args.concurrency)
    import django

    django.setup()
    return args.concurrency


def login() -> tuple[object, str]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    user = get_user_model().objects.create_user("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    connection.close()
    return user, cookie


def find_max(stack: Stack, capacity: int, args: argparse.Namespace, log: list[RoundResult]) -> int:
    """The largest socket count that passes, by doubling then bisecting."""
    passed, failed, streams = 0, 0, args.find_start
    while True:
        try:
            result = run_round(stack, min(streams, capacity), streams)
        except Exception as exc:  # sockets refused or a run never ended: this count is too many
            report(f"find-max: {streams} sockets -> {type(exc).__name__}: {exc}: fail")
            ok = False
        else:
            log.append(result)
            ok = result.clean and result.p99_ms <= args.p99_limit
            report(
                f"find-max: {streams} sockets on {result.runs} runs -> p99 {result.p99_ms:.1f} ms, "
                f"lost {result.lost}: {'pass' if ok else 'fail'}"
            )
        if ok:
            passed = streams
        else:
            failed = streams
        if failed and failed - passed <= max(1, passed // 10):
            return passed
        if not failed and streams >= args.max_streams:
            return passed
        streams = min(streams * 2, args.max_streams) if not failed else (passed + failed) // 2


def report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> None:
    args = parse()
    levels = [int(n) for n in args.levels.split(",") if n.strip()]
    res.fresh_database(args.database)
    concurrency = setup_django(args)
    workers_needed = math.ceil(max(levels) / concurrency)
    count = args.workers or workers_needed
    capacity = count * concurrency
    if capacity < max(levels):
        sys.exit(f"{count} workers x {concurrency} cannot execute {max(levels)} runs at once")
    user, cookie = login()
    environ = res.env(args.database, MODEL_PORT)
    procs: list[Process] = []
    try:
        model = StampingModel(MODEL_PORT, "--gated", "--chunks", str(args.chunks), "--pace", str(args.pace))
        procs.append(model)
        daphne = Daphne(DAPHNE_PORT, environ)
        procs.append(daphne)
        report(f"starting {count} workers (concurrency {concurrency})")
        workers = start_workers(count, environ)
        procs.extend(workers)
        stack = Stack(model, daphne, workers, cookie, user, args.client_procs, patience=20, tap=args.tap)
        results = []
        failure = ""
        for runs in levels:
            try:
                result = run_round(stack, runs, runs)
            except Exception as exc:  # e.g. PostgreSQL out of connections: report it, measure no further
                failure = f"{runs} runs: {type(exc).__name__}: {exc}"
                report(failure)
                break
            report(f"{runs} runs: p50 {result.p50_ms:.1f} p99 {result.p99_ms:.1f} max {result.max_ms:.1f} ms")
            results.append(result)
        probes: list[RoundResult] = []
        runs_cap = min(args.find_runs or capacity, capacity)
        largest = find_max(stack, runs_cap, args, probes) if args.find_max and not failure else None
    finally:
        for proc in reversed(procs):
            proc.stop()
        if not args.keep_db:
            res.drop_database(args.database)
        res.release_redis()
    setup = {"workers": count, "concurrency": concurrency, "chunks": args.chunks, "pace_s": args.pace}
    if args.json:
        print(
            json.dumps(
                {
                    "setup": setup,
                    "failure": failure,
                    "levels": [asdict(r) for r in results],
                    "find_max": None
                    if largest is None
                    else {"streams": largest, "probes": [asdict(r) for r in probes]},
                }
            )
        )
        return
    print_tables(setup, results, probes, largest)
    if failure:
        print(f"\nstopped: {failure}")


def print_tables(
    setup: dict[str, object], results: list[RoundResult], probes: list[RoundResult], largest: int | None
) -> None:
    headers = [
        "runs",
        "sockets",
        "samples",
        "p50 ms",
        "p99 ms",
        "max ms",
        "lost",
        "wrong text",
        "out of order",
        "dup",
        "no end",
        "failed",
        "stamps/delta",
        "daphne ms/event",
        "worker ms/run",
        "layer p50",
        "layer p99",
        "layer max",
        "repaired",
        "host busy %",
        "load",
        "Redis B/run",
    ]

    def row(r: RoundResult) -> list[object]:
        return [
            r.runs,
            r.streams,
            r.samples,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.lost,
            r.wrong_text,
            r.out_of_order,
            r.duplicates,
            r.unended,
            r.failed_runs,
            f"{r.stamps_per_delta:.2f}",
            f"{r.daphne_cpu_ms_per_event:.3f}",
            r.worker_cpu_ms_per_run,
            r.layer_p50_ms,
            r.layer_p99_ms,
            r.layer_max_ms,
            sum(r.repaired.values()),
            r.host_busy_pct,
            r.load_avg,
            round(r.redis_bytes_per_run),
        ]

    print(f"setup: {setup}")
    print(table(headers, [row(r) for r in results]))
    if largest is not None:
        print("\nfind-max probes:")
        print(table(headers, [row(r) for r in probes]))
    print("(layer: measured at a channel-layer tap, before daphne; '-' without --tap)")
    if largest is not None:
        print(f"\nlargest socket count one daphne served within the limits: {largest}")


if __name__ == "__main__":
    main()
