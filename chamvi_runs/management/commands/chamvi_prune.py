"""``manage.py chamvi_prune --older-than 30d``: retention of settled runs and unreferenced artifacts.
The deletes are ``chamvi_runs.store.pruning``'s; this module reads the arguments and prints the
report."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter

from chamvi_runs.core.states import TERMINAL, Status
from chamvi_runs.store.pruning import MODELS, PruneRefused, PruneReport, Retention, prune

UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
DURATION = re.compile(r"(\d+)([dhms])")
SETTLED = ",".join(sorted(TERMINAL))

HELP = f"""\
Delete settled runs older than --older-than, with their steps, checkpoint, wait points, inputs
and effect records, in batches of --batch-size runs, one short transaction each; then artifacts
older than the cutoff that no remaining run references, and their files.

A run's age is counted from finished_at (created_at if it has none) by the database's clock. Only
{SETTLED.replace(",", ", ")} runs are ever deleted: queued, running, waiting and interrupted runs
are never touched, and each delete re-checks status and age, so a run that changed meanwhile stays.

Threads: a new run of a thread starts from the history of the thread's latest settled run, so the
newest settled run with a checkpoint of each thread (of each creator in it) is kept however old.
With --threads, a thread whose every run is settled, in --status and older than the cutoff goes
whole, history included, and so do Thread rows older than the cutoff left with no run. A thread in
which a run is being started meanwhile is passed over whole: it stays its owner's, history included.

Artifacts are referenced by runs' triggers (attachments) and checkpoint histories
(chamvi-artifact:<id>); an artifact older than the cutoff that no remaining run references goes,
its row first, its file after the row's commit.

Bytes: on PostgreSQL, the stored size of the deleted rows (pg_column_size of each row: columns as
stored, compressed and TOASTed values included; index entries not), plus the artifact files'
recorded sizes; on other databases, the files' sizes only. Freed table space is reused by later
rows; VACUUM FULL (or pg_repack) returns it to the operating system.
"""


class _Formatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's help layout, keeping the paragraphs of the description."""


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s`` as a positive duration; a CommandError otherwise."""
    match = DURATION.fullmatch(text.strip())
    if match is None or int(match[1]) == 0:
        raise CommandError(
            f"--older-than {text!r}: expected a positive whole number and a unit d, h, m or s "
            "(e.g. 30d, 12h, 90m, 3600s)"
        )
    return timedelta(**{UNITS[match[2]]: int(match[1])})


def parse_statuses(text: str) -> frozenset[Status]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise CommandError(f"--status: name one or more of {SETTLED}")
    statuses = set()
    for name in names:
        try:
            status = Status(name)
        except ValueError:
            raise CommandError(f"--status {name!r}: not a run status (settled ones: {SETTLED})") from None
        if status not in TERMINAL:
            raise CommandError(
                f"--status {name}: a {name} run is not settled; only {SETTLED} runs can be pruned"
            )
        statuses.add(status)
    return frozenset(statuses)


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = _Formatter
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="Age of the runs to delete: 30d, 12h, 90m, 3600s.",
        )
        parser.add_argument(
            "--status",
            default=SETTLED,
            metavar="STATUSES",
            help=f"Comma-separated settled statuses of the runs to delete (default {SETTLED}).",
        )
        parser.add_argument(
            "--threads",
            action="store_true",
            help="Also delete threads idle past the cutoff whole: the history their newest run keeps, "
            "and their Thread rows.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count and measure what would go; change nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=500,
            metavar="N",
            help="Runs (threads, artifacts) per transaction (default 500).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        age = parse_age(options["older_than"])
        statuses = parse_statuses(options["status"])
        if options["batch_size"] < 1:
            raise CommandError(f"--batch-size {options['batch_size']}: must be at least 1")
        try:
            retention = Retention(older_than=age, statuses=statuses, threads=options["threads"])
            report = prune(retention, dry_run=options["dry_run"], batch_size=options["batch_size"])
        except PruneRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(render(report, options["older_than"], options["batch_size"]))
        for error in report.file_errors:
            self.stderr.write(f"file not deleted: {error}")


def render(report: PruneReport, age: str, batch_size: int) -> str:
    """The report as a table: rows and bytes per model, then the files, totals and timings."""

    def size(value: int) -> str:
        return f"{value:,}" if report.measured else "n/a"

    lines = [
        f"Dry run, nothing deleted: settled more than {age} ago, would delete"
        if report.dry_run
        else f"Deleted, settled more than {age} ago:",
        f"{'':<14}{'rows':>12}{'bytes':>16}",
    ]
    lines += [f"{name:<14}{report.rows[name]:>12,}{size(report.row_bytes[name]):>16}" for name in MODELS]
    lines.append(f"{'artifact files':<14}{report.files:>12,}{report.file_bytes:>16,}")
    total_bytes = f"{report.total_bytes:,}" if report.measured else f"{report.file_bytes:,} (files)"
    lines.append(f"{'total':<14}{report.total_rows:>12,}{total_bytes:>16}")
    if report.kept_histories:
        lines.append(
            f"Kept {report.kept_histories:,} old runs that hold their thread's latest history "
            "(--threads lets threads idle past the cutoff go whole)."
        )
    lines.append(
        f"{report.batches} batches of at most {batch_size}; longest {report.longest_batch:.3f} s; "
        f"elapsed {report.elapsed:.3f} s."
    )
    return "\n".join(lines)
