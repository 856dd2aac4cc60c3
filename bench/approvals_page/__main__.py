"""The approvals page (``GET chamvi/approvals/``) with 1,500 waiting runs, for a user who may decide
nothing and for an approver.

Drops, creates and migrates its own PostgreSQL database (``chamvi_approvals_bench``), measures the
page with no waiting run (the baseline: what any request of the page costs), then bulk-inserts
``--runs`` waiting runs, each with a trigger of a few KB and its open approval, and measures again.
For each case: the median time of a request over ``--requests`` requests (after one to warm up),
the peak of Python memory one request allocates (tracemalloc, in a request of its own: tracing
slows the code), the SQL statements it ran and the bytes of HTML served; then the ratios of the
figures at ``--runs`` waiting runs to the baseline's.

    .venv/bin/python -m bench.approvals_page
    .venv/bin/python -m bench.approvals_page --runs 5000 --keep-db
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import time
import tracemalloc
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from bench.common import databases

PG = os.environ.get("CHAMVI_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
PAGE = "/chamvi/approvals/"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1500, help="waiting runs (default 1500)")
    parser.add_argument("--trigger-kb", type=float, default=4.0, help="size of each trigger payload")
    parser.add_argument("--requests", type=int, default=7, help="timed requests per case")
    parser.add_argument("--database", default="chamvi_approvals_bench")
    parser.add_argument("--keep-db", action="store_true", help="leave the database for a look afterwards")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


def recreate_database(name: str, drop_only: bool = False) -> None:
    assert name.startswith("chamvi_approvals"), name
    if drop_only:
        databases.drop(PG, name)
    else:
        databases.recreate(PG, name)


def setup_django(database: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.common.settings",
        DATABASE_URL=f"{PG}/{database}",
        CHAMVI_LOG_LEVEL="WARNING",
    )
    os.environ.pop("REDIS_URL", None)  # the page enqueues nothing
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def words(rng: random.Random, size: int) -> str:
    """Prose-like text of about ``size`` characters."""
    out: list[str] = []
    length = 0
    while length < size:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10)))
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def insert_waiting_runs(count: int, trigger_kb: float, rng: random.Random, creator: Any) -> None:
    from django.utils import timezone

    from chamvi_runs.models import Run, Step, WaitPoint

    now = timezone.now()
    runs, steps, waitpoints = [], [], []
    for n in range(count):
        body = words(rng, int(trigger_kb * 1024))
        run = Run(
            agent="support",
            status="waiting",
            trigger={
                "id": None,
                "source": "api",
                "trigger": "http",
                "payload": {"title": words(rng, 60), "body": body},
                "keys": {"customer": f"c-{rng.randint(1, 500)}"},
                "thread": None,
                "receivedAt": now.isoformat(),
                "attachments": [],
            },
            created_by=creator,
            model_calls=1,
            attempt=1,
            created_at=now - timedelta(seconds=count - n),
            started_at=now - timedelta(seconds=count - n),
        )
        runs.append(run)
        arguments = {"order_id": f"A-{n}", "amount_cents": rng.randint(100, 99999), "note": words(rng, 200)}
        answer = {"text": words(rng, 300)}
        steps.append(Step(run=run, index=0, kind="llm", name="m", output=answer, started_at=now))
        steps.append(
            Step(run=run, index=1, kind="wait", name="issue_refund", input=arguments, started_at=now)
        )
        waitpoints.append(
            WaitPoint(
                run=run,
                step_index=1,
                tool_call_id=f"call_{n}",
                tool_name="issue_refund",
                input=arguments,
                expires_at=now + timedelta(hours=24, seconds=n),
            )
        )
    Run.objects.bulk_create(runs, batch_size=500)
    Step.objects.bulk_create(steps, batch_size=1000)
    WaitPoint.objects.bulk_create(waitpoints, batch_size=1000)


@dataclass
class Figures:
    seconds: float
    peak_bytes: int
    queries: int
    html_bytes: int
    rows: int


def measure(client: Any, requests: int) -> Figures:
    from django.db import connection

    response = client.get(PAGE)  # warm-up: caches, the session, the permission cache of nothing
    assert response.status_code == 200, response.status_code
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(PAGE)
        times.append(time.perf_counter() - started)
    queries: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries.append(sql)
        return execute(sql, params, many, context)

    # A wrapper, not CaptureQueriesContext: the request's start resets the connection's query log.
    with connection.execute_wrapper(count):
        client.get(PAGE)
    tracemalloc.start()
    tracemalloc.reset_peak()
    response = client.get(PAGE)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    content = response.content
    return Figures(
        statistics.median(times), peak, len(queries), len(content), content.count(b'class="approval"')
    )


def line(label: str, f: Figures) -> str:
    return (
        f"  {label:<34} {f.seconds * 1000:9.1f} ms {f.peak_bytes / 1e6:9.2f} MB "
        f"{f.queries:5d} queries {f.html_bytes / 1000:8.1f} kB HTML {f.rows:5d} rows"
    )


def ratio(label: str, at_n: Figures, base: Figures) -> str:
    return (
        f"  {label:<34} time {at_n.seconds / base.seconds:6.2f}x   "
        f"memory {at_n.peak_bytes / base.peak_bytes:6.2f}x   queries {base.queries} → {at_n.queries}"
    )


def main() -> None:
    args = parse()
    recreate_database(args.database)
    try:
        setup_django(args.database)
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission
        from django.test import Client

        users = get_user_model()
        nobody = users.objects.create_user("nobody", "nobody@example.com", "pw")
        approver = users.objects.create_user("approver", "approver@example.com", "pw")
        approver.user_permissions.add(Permission.objects.get(codename="approve_waitpoint"))
        clients = {}
        for label, user in (("a user who may decide nothing", nobody), ("an approver", approver)):
            client = Client(HTTP_HOST="localhost")
            client.force_login(user)
            clients[label] = client

        baseline = {label: measure(client, args.requests) for label, client in clients.items()}
        started = time.perf_counter()
        insert_waiting_runs(args.runs, args.trigger_kb, random.Random(args.seed), nobody)
        inserted = time.perf_counter() - started
        loaded = {label: measure(client, args.requests) for label, client in clients.items()}

        print(f"GET {PAGE}: median of {args.requests} requests, tracemalloc peak of one, PostgreSQL")
        print(f"(inserted {args.runs} waiting runs with {args.trigger_kb:g} KB triggers in {inserted:.1f} s)")
        print("no waiting run (baseline):")
        for label, figures in baseline.items():
            print(line(label, figures))
        print(f"{args.runs} waiting runs:")
        for label, figures in loaded.items():
            print(line(label, figures))
        print(f"ratios, {args.runs} waiting runs ÷ baseline:")
        for label in clients:
            print(ratio(label, loaded[label], baseline[label]))
    finally:
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            recreate_database(args.database, drop_only=True)


if __name__ == "__main__":
    main()
