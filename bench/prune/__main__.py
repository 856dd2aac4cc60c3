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
import os
import tempfile
import time
from pathlib import Path

from bench.common import databases

from .measure import TABLES, counts, figures, history_size, live_runs, prune, scrape, sizes, vacuum
from .seed import age, build

PG = os.environ.get("CHAMVI_BENCH_PG", "postgres://postgres@127.0.0.1:5432")


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
