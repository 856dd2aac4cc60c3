"""Retention at scale: ``manage.py chamvi_prune`` on a database of 10,000 runs.

Drops, creates and migrates its own PostgreSQL database (``chamvi_prune_bench``), bulk-inserts
realistic runs (five steps each, a checkpoint with a history of a few KB, wait points, steering
inputs, effect records, threads, artifacts with files in a temporary MEDIA_ROOT), ages most of them
past 30 days in SQL, then runs ``chamvi_prune --older-than 30d --dry-run`` and the same for real.
Prints what the command printed, then: rows and bytes freed, elapsed seconds, rows/s, the longest
batch transaction, and pg_total_relation_size of the tables before, after, after VACUUM and after
VACUUM FULL; before and after the prune, the cost of a scrape of the metrics view (its database
gauges read the run table) and the gauges it served.

    .venv/bin/python -m bench.prune
    .venv/bin/python -m bench.prune --runs 50000 --batch-size 1000 --keep-db
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import string
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import databases

PG = os.environ.get("CHAMVI_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
TABLES = ("run", "step", "checkpoint", "waitpoint", "runinput", "effectrecord", "thread", "artifact")
LIVE = ("queued", "running", "waiting", "interrupted")
# Of every 100 runs: their status. Terminal ones dominate, as in any deployment that keeps history.
STATUSES = ["completed"] * 80 + ["failed"] * 8 + ["cancelled"] * 7 + ["waiting"] * 2 + ["running"] * 2
STATUSES += ["queued"]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--artifacts", type=int, default=600)
    parser.add_argument("--old-percent", type=int, default=85, help="share of runs aged past 30 days")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--threads", action="store_true", help="prune with --threads")
    parser.add_argument("--database", default="chamvi_prune_bench")
    parser.add_argument("--keep-db", action="store_true", help="leave the database for a look afterwards")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


def fresh_database(name: str) -> None:
    assert name.startswith("chamvi_prune"), name
    databases.recreate(PG, name)


def drop_database(name: str) -> None:
    databases.drop(PG, name)


def setup_django(database: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.common.settings",
        DATABASE_URL=f"{PG}/{database}",
        CHAMVI_LOG_LEVEL="WARNING",
    )
    os.environ.pop("REDIS_URL", None)  # nothing is enqueued: no Redis needed
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Words:
    """Text that compresses like prose (a vocabulary of made-up words), not like one repeated byte."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.vocabulary = [
            "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))) for _ in range(3000)
        ]

    def __call__(self, size: int) -> str:
        words: list[str] = []
        length = 0
        while length < size:
            word = self.rng.choice(self.vocabulary)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)


def build(args: argparse.Namespace) -> dict[str, int]:
    """Insert the runs and their rows; returns counts of what was made."""
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage
    from django.utils import timezone

    from chamvi_runs.models import Artifact, Checkpoint, EffectRecord, Run, RunInput, Step, Thread, WaitPoint

    rng = random.Random(args.seed)
    words = Words(rng)
    now = timezone.now()

    artifacts = []
    for i in range(args.artifacts):
        name = default_storage.save(
            f"chamvi_artifacts/bench/a{i}.bin", ContentFile(rng.randbytes(rng.randint(8, 64) * 1024))
        )
        artifacts.append(
            Artifact(
                filename=f"a{i}.bin",
                media_type="application/octet-stream",
                size=default_storage.size(name),
                file=name,
            )
        )
    Artifact.objects.bulk_create(artifacts, batch_size=1000)
    # Two thirds are attached to runs, the rest were uploaded and never used.
    attachable = artifacts[: len(artifacts) * 2 // 3]

    runs, steps, checkpoints, waitpoints, inputs, effects, threads = [], [], [], [], [], [], []
    position = 0
    while position < args.runs:
        thread = None
        size = 1
        if rng.random() < 0.3:  # a conversation of 3 to 6 runs
            thread = f"thr-{position}"
            size = rng.randint(3, 6)
            threads.append(Thread(name=thread))
        for _ in range(min(size, args.runs - position)):
            position += 1
            status = rng.choice(STATUSES)
            attached = [rng.choice(attachable)] if attachable and rng.random() < 0.05 else []
            created = now - timedelta(seconds=args.runs - position)
            run = Run(
                agent="support",
                status=status,
                trigger={
                    "id": None,
                    "source": "api",
                    "trigger": "http",
                    "payload": {"title": words(60), "body": words(rng.randint(200, 600))},
                    "keys": {"customer": f"c-{rng.randint(1, 500)}"},
                    "thread": thread,
                    "receivedAt": created.isoformat(),
                    "attachments": [
                        {"id": a.pk, "filename": a.filename, "media_type": a.media_type} for a in attached
                    ],
                },
                thread=thread,
                output=words(300) if status == "completed" else None,
                error_code="model_error" if status == "failed" else "",
                input_tokens=rng.randint(500, 5000),
                output_tokens=rng.randint(50, 800),
                model_calls=3,
                attempt=1,
                created_at=created,
                started_at=None if status == "queued" else created,
                finished_at=created + timedelta(seconds=20)
                if status in ("completed", "failed", "cancelled")
                else None,
            )
            runs.append(run)
            if status == "queued":
                continue
            history: list[dict[str, Any]] = [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": words(rng.randint(800, 2400))}]
                    + [
                        {
                            "type": "file",
                            "file": {"file_data": f"chamvi-artifact:{a.pk}", "filename": a.filename},
                        }
                        for a in attached
                    ],
                }
            ]
            for index in range(5):
                kind = "llm" if index % 2 == 0 else "tool"
                if kind == "llm":
                    text = words(rng.randint(300, 900))
                    calls = (
                        []
                        if index == 4
                        else [
                            {
                                "id": f"call_{index}",
                                "type": "function",
                                "function": {"name": "lookup_order", "arguments": '{"order_id": "o-1"}'},
                            }
                        ]
                    )
                    step_input: Any = {"messages": len(history) + 1, "inputs": []}
                    step_output: Any = {
                        "text": text,
                        "reasoning": "",
                        "tool_calls": calls,
                        "finish_reason": "tool_calls" if calls else "stop",
                        "usage": {"input_tokens": 900, "output_tokens": 120},
                    }
                    history.append(
                        {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
                    )
                else:
                    step_input = {"order_id": "o-1"}
                    step_output = {"order": words(rng.randint(200, 800))}
                    history.append(
                        {"role": "tool", "tool_call_id": f"call_{index - 1}", "content": str(step_output)}
                    )
                steps.append(
                    Step(
                        run=run,
                        index=index,
                        kind=kind,
                        name="gpt-4o-mini" if kind == "llm" else "lookup_order",
                        input=step_input,
                        output=step_output,
                        attempt=1,
                        started_at=created,
                        finished_at=created,
                    )
                )
            checkpoints.append(Checkpoint(run=run, step_index=4, messages=history, finish_reason="stop"))
            if status == "waiting" or rng.random() < 0.1:
                waitpoints.append(
                    WaitPoint(
                        run=run,
                        step_index=2,
                        model_step=0,
                        call_position=0,
                        tool_call_id="call_0",
                        tool_name="issue_refund",
                        input={"order_id": "o-1", "amount_cents": 500},
                        decision=None if status == "waiting" else "approved",
                        decided_at=None if status == "waiting" else created,
                        reason="" if status == "waiting" else words(40),
                    )
                )
            if rng.random() < 0.1:
                inputs.append(RunInput(run=run, payload=words(rng.randint(40, 200)), consumed_step=2))
            if rng.random() < 0.15:
                effects.append(
                    EffectRecord(
                        run=run,
                        key=f"{run.pk}:0:0",
                        tool_name="issue_refund",
                        input={"order_id": "o-1", "amount_cents": 500},
                        output={"refund_id": f"re_{rng.randint(1, 10**9)}", "status": "succeeded"},
                    )
                )
    Thread.objects.bulk_create(threads, batch_size=2000)
    Run.objects.bulk_create(runs, batch_size=2000)
    for model, rows in (
        (Step, steps),
        (Checkpoint, checkpoints),
        (WaitPoint, waitpoints),
        (RunInput, inputs),
        (EffectRecord, effects),
    ):
        model.objects.bulk_create(rows, batch_size=2000)
    return {
        "Run": len(runs),
        "Step": len(steps),
        "Checkpoint": len(checkpoints),
        "WaitPoint": len(waitpoints),
        "RunInput": len(inputs),
        "EffectRecord": len(effects),
        "Thread": len(threads),
        "Artifact": len(artifacts),
    }


def age(old_percent: int) -> None:
    """Move most runs (the runs of a thread together, so its order stays) and artifacts 31 to 180
    days into the past, and every thread row to its oldest run."""
    from django.db import connection

    with connection.cursor() as cursor:
        shift = "(31 + abs(hashtext(coalesce(thread, id))) %% 150) * interval '1 day'"
        cursor.execute(
            f"""
            UPDATE chamvi_runs_run SET
                created_at = created_at - {shift}, finished_at = finished_at - {shift},
                started_at = started_at - {shift}
            WHERE abs(hashtext(coalesce(thread, id) || ':old')) %% 100 < %s
            """,
            [old_percent],
        )
        cursor.execute(
            "UPDATE chamvi_runs_artifact "
            "SET created_at = created_at - (31 + abs(hashtext(id)) % 150) * interval '1 day'"
        )
        cursor.execute(
            """
            UPDATE chamvi_runs_thread t SET created_at = r.first FROM (
                SELECT thread, min(created_at) AS first FROM chamvi_runs_run GROUP BY thread
            ) r WHERE r.thread = t.name
            """
        )
        cursor.execute("ANALYZE")


def history_size() -> tuple[float, float]:
    """A checkpoint's history on average, in KiB: as JSON text, and as stored (compressed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT avg(length(messages::text)), avg(pg_column_size(messages)) FROM chamvi_runs_checkpoint"
        )
        text, stored = cursor.fetchone()
        return float(text) / 1024, float(stored) / 1024


def sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
            [[f"chamvi_runs_{t}" for t in TABLES]],
        )
        return {name.removeprefix("chamvi_runs_"): size for name, size in cursor.fetchall()}


def vacuum(full: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM {'FULL ' if full else ''}ANALYZE chamvi_runs_{table}")


def counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM chamvi_runs_{t}" for t in TABLES))
        return dict(cursor.fetchall())


def live_runs() -> dict[str, int]:
    from django.db.models import Count

    from chamvi_runs.models import Run

    counted = Run.objects.filter(status__in=LIVE).values("status").annotate(n=Count("pk"))
    return {row["status"]: row["n"] for row in counted}


def prune(*args: str) -> tuple[str, float]:
    from django.core.management import call_command

    out = io.StringIO()
    started = time.monotonic()
    call_command("chamvi_prune", *args, stdout=out)
    return out.getvalue(), time.monotonic() - started


def figures(output: str) -> dict[str, Any]:
    """The command's table and timings, read back from what it printed."""
    table = {}
    for line in output.splitlines():
        match = re.fullmatch(r"(\w+(?: files)?)\s+([\d,]+)\s+([\d,]+)", line)
        if match:
            table[match[1]] = (int(match[2].replace(",", "")), int(match[3].replace(",", "")))
    timing = re.search(r"(\d+) batches of at most \d+; longest ([\d.]+) s; elapsed ([\d.]+) s", output)
    assert timing, output
    return {
        "table": table,
        "batches": int(timing[1]),
        "longest": float(timing[2]),
        "elapsed": float(timing[3]),
    }


def scrape(times: int = 20) -> tuple[float, int, dict[str, float]]:
    """The metrics view, as Prometheus scrapes it (a bearer token): median ms per scrape, the
    response's bytes, and the database gauges it served."""
    from django.test import Client
    from django.test.utils import override_settings

    from project.settings import CHAMVI_RUNS

    token = "bench-scrape"
    with override_settings(ALLOWED_HOSTS=["testserver"], CHAMVI_RUNS={**CHAMVI_RUNS, "METRICS_TOKEN": token}):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        timings, body = [], b""
        for _ in range(times):
            started = time.perf_counter()
            response = client.get("/metrics")
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.status_code
            body = response.content
    gauges = {}
    for line in body.decode().splitlines():
        if line.startswith(("chamvi_runs{", "chamvi_approvals_waiting ", "chamvi_leases_expired ")):
            name, value = line.rsplit(" ", 1)
            gauges[name] = float(value)
    return sorted(timings)[len(timings) // 2], len(body), gauges


def print_scrape(when: str) -> None:
    ms, size, gauges = scrape()
    shown = ", ".join(f"{name} {value:,.0f}" for name, value in gauges.items() if value)
    print(f"metrics scrape {when}: {ms:.1f} ms median of 20, {size:,} B; {shown}")


def mib(value: int) -> str:
    return f"{value / 2**20:,.2f}"


def main() -> None:
    args = parse()
    fresh_database(args.database)
    setup_django(args.database)
    from django.test.utils import override_settings

    try:
        with (
            tempfile.TemporaryDirectory(prefix="chamvi-prune-bench-") as media,
            override_settings(MEDIA_ROOT=media),
        ):
            started = time.monotonic()
            made = build(args)
            age(args.old_percent)
            print(
                f"built in {time.monotonic() - started:.1f} s: "
                + ", ".join(f"{n:,} {m}" for m, n in made.items())
            )
            text_kib, stored_kib = history_size()
            print(f"a checkpoint's history: {text_kib:.1f} KiB of JSON, {stored_kib:.1f} KiB stored")
            files_before = sum(1 for p in Path(media).rglob("*") if p.is_file())
            before, live_before, rows_before = sizes(), live_runs(), counts()

            print_scrape("before the prune")

            flags = ["--older-than", "30d", "--batch-size", str(args.batch_size)]
            flags += ["--threads"] if args.threads else []
            dry_output, _ = prune(*flags, "--dry-run")
            assert counts() == rows_before, "the dry run must change nothing"
            print(dry_output)
            output, wall = prune(*flags)
            print(output)
            print_scrape("after the prune")
            after = sizes()
            vacuum(full=False)
            after_vacuum = sizes()
            vacuum(full=True)
            after_full = sizes()
            files_after = sum(1 for p in Path(media).rglob("*") if p.is_file())

            dry, real = figures(dry_output), figures(output)
            assert dry["table"] == real["table"], "the dry run must report what the real run deletes"
            assert live_runs() == live_before, "live runs must never be deleted"
            rows, freed = real["table"]["total"]
            print(f"rows deleted           {rows:,} (dry run reported the same)")
            print(f"bytes freed            {freed:,} ({mib(freed)} MiB; rows' stored size + artifact files)")
            print(f"artifact files         {files_before:,} -> {files_after:,}")
            print(f"elapsed                {real['elapsed']:.2f} s (command wall time {wall:.2f} s)")
            print(f"rows/s                 {rows / real['elapsed']:,.0f}")
            print(
                f"batches                {real['batches']}, "
                f"longest transaction {real['longest'] * 1000:.0f} ms"
            )
            print()
            print(f"{'table':<14}{'before MiB':>12}{'after':>12}{'VACUUM':>12}{'VACUUM FULL':>13}")
            for table in TABLES:
                print(
                    f"{table:<14}{mib(before[table]):>12}{mib(after[table]):>12}"
                    f"{mib(after_vacuum[table]):>12}{mib(after_full[table]):>13}"
                )
            print(
                f"{'total':<14}{mib(sum(before.values())):>12}{mib(sum(after.values())):>12}"
                f"{mib(sum(after_vacuum.values())):>12}{mib(sum(after_full.values())):>13}"
            )
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            drop_database(args.database)


if __name__ == "__main__":
    main()
