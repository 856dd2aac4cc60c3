"""Retention, for ``manage.py chamvi_prune``: delete settled runs with their steps, checkpoint, wait
points, inputs and effect records; then (with ``threads``) the Thread rows left with no run; then
the artifacts no remaining run references, rows first and files after their commit.

Every delete re-checks, in its own statement, what made its rows deletable (a run settled before
the cutoff, not carrying its thread's history; an artifact older than the cutoff), so a row that
changed meanwhile stays. Each batch is one short transaction whose rows are locked with SKIP
LOCKED: nothing waits on a live run, and no lock is held for long. A dry run makes the same
selections and measures, and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, Model, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan

from ..core.states import TERMINAL, Status
from ..models import Artifact, Checkpoint, EffectRecord, Run, RunInput, Step, Thread, WaitPoint
from .children import descendants
from .fence import db_now_plus
from .references import attached, referenced_artifacts

CHILDREN: tuple[type[Model], ...] = (Step, Checkpoint, WaitPoint, RunInput, EffectRecord)
MODELS: tuple[str, ...] = ("Run", *(m.__name__ for m in CHILDREN), "Thread", "Artifact")

# A run started with an old attachment while the prune scans: its transaction began before the
# scan and committed after it, so its created_at (its transaction's start) may precede the scan.
START_MARGIN = timedelta(minutes=10)

_TERMINAL = sorted(s.value for s in TERMINAL)


class PruneRefused(Exception):
    """The prune cannot run as asked; nothing was changed."""


@dataclass(frozen=True)
class Retention:
    """Which runs go: settled in ``statuses`` before the database's now minus ``older_than``. The run
    whose history a thread's next run would start from stays, unless ``threads`` and its whole
    thread goes."""

    older_than: timedelta
    statuses: frozenset[Status] = TERMINAL
    threads: bool = False

    def __post_init__(self) -> None:
        unsettled = sorted(self.statuses - TERMINAL)
        if not self.statuses or unsettled:
            settled = ", ".join(sorted(TERMINAL))
            named = f": {', '.join(unsettled)} is not settled" if unsettled else ""
            raise PruneRefused(f"only settled runs ({settled}) can be pruned{named}")
        if self.older_than <= timedelta(0):
            raise PruneRefused("the age must be positive")

    def cutoff(self) -> Any:
        return db_now_plus(-self.older_than)

    def old(self) -> Q:
        """Settled in one of ``statuses`` before the cutoff (finished_at, or created_at without it)."""
        settled = Coalesce("finished_at", "created_at")
        return Q(status__in=sorted(s.value for s in self.statuses)) & Q(LessThan(settled, self.cutoff()))

    def deletable(self) -> Q:
        keeps_history = carries_history() | Q(_base_of_unsettled())
        if self.threads:
            # Unless no run of the thread stays: then the whole thread goes, its history with it.
            same_thread = Run.objects.filter(thread=OuterRef("thread"), scope=OuterRef("scope"))
            keeps_history &= Q(Exists(same_thread.exclude(self.old())))
        # A child run (SPEC §13) goes with the run that started it, never alone: that run's wait
        # points name it.
        return self.old() & ~keeps_history & Q(parent__isnull=True)


def _base_of_unsettled() -> Exists:
    """A run whose history a fork, regenerate or resend that has not settled yet starts from."""
    return Exists(Run.objects.filter(base_id=OuterRef("pk")).exclude(status__in=_TERMINAL))


def _has_checkpoint() -> Exists:
    return Exists(Checkpoint.objects.filter(run=OuterRef("pk")))


def _newer_history(**creator: Any) -> Exists:
    newer = Run.objects.filter(
        _has_checkpoint(),
        thread=OuterRef("thread"),
        scope=OuterRef("scope"),
        status__in=_TERMINAL,
        created_at__gt=OuterRef("created_at"),
        **creator,
    )
    return Exists(newer)


def carries_history() -> Q:
    """The run's history is one a new run of its thread may start from (``runtime.start_point``):
    the newest settled run with a checkpoint of its thread among the runs
    of its creator. A run without a creator takes only histories of runs without one; a user takes
    the newest they may view, which the default policy makes theirs or, with ``view_run``, anyone's:
    the newest of each creator covers both."""
    return (
        Q(thread__isnull=False)
        & Q(_has_checkpoint())
        & (
            (Q(created_by__isnull=True) & ~Q(_newer_history(created_by__isnull=True)))
            | (Q(created_by__isnull=False) & ~Q(_newer_history(created_by=OuterRef("created_by"))))
        )
    )


@dataclass
class PruneReport:
    """What a prune deleted (or, dry, would delete). ``row_bytes`` is measured on PostgreSQL only
    (``measured``): pg_column_size of each deleted row."""

    dry_run: bool
    measured: bool
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODELS, 0))
    row_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODELS, 0))
    files: int = 0
    file_bytes: int = 0
    file_errors: list[str] = field(default_factory=list)
    kept_histories: int = 0
    batches: int = 0
    longest_batch: float = 0.0
    elapsed: float = 0.0

    def add(self, model: str, rows: int, size: int) -> None:
        self.rows[model] += rows
        self.row_bytes[model] += size

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.row_bytes.values()) + self.file_bytes


def prune(retention: Retention, *, dry_run: bool = False, batch_size: int = 500) -> PruneReport:
    """Delete (``dry_run``: only measure) what ``retention`` lets go, ``batch_size`` runs, threads or
    artifacts per transaction. Raises PruneRefused, having changed nothing, inside a transaction
    (its batches would be one long one, and files would go before their rows' commit) or when a
    model outside chamvi_runs references Run (its rows would block or lose the delete)."""
    if batch_size < 1:
        raise PruneRefused("the batch size must be at least 1")
    if connection.in_atomic_block:
        raise PruneRefused("prune runs its own transactions, one per batch: call it outside atomic()")
    foreign = sorted(
        rel.related_model._meta.label
        for rel in Run._meta.related_objects
        # A run's references to other runs (``base``, ``replaces``) hold no constraint: they may
        # name a pruned run.
        if rel.related_model not in (*CHILDREN, Run) and not isinstance(rel.related_model, str)
    )
    if foreign:
        raise PruneRefused(f"{', '.join(foreign)} reference Run: delete their rows first")
    report = PruneReport(dry_run=dry_run, measured=connection.vendor == "postgresql")
    started = time.monotonic()
    # After a real batch the deleted runs are gone: what remains is every run. A dry run deletes
    # nothing, so what would remain is every run it would not delete.
    remaining = Run.objects.exclude(retention.deletable()) if dry_run else Run.objects.all()
    _prune_runs(retention, report, batch_size)
    if retention.threads:
        _prune_threads(retention, report, remaining, batch_size)
    _prune_artifacts(retention, report, remaining, batch_size)
    with _transaction(writes=False):
        report.kept_histories = Run.objects.filter(retention.old()).exclude(retention.deletable()).count()
    report.elapsed = time.monotonic() - started
    return report


class _Batch:
    """Times one batch (its transaction, in a real prune) into the report; the last page, which
    found nothing, is no batch."""

    def __init__(self, report: PruneReport) -> None:
        self.report = report
        self.started = 0.0
        self.rows = 0

    def __enter__(self) -> _Batch:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rows:
            self.report.batches += 1
            self.report.longest_batch = max(self.report.longest_batch, time.monotonic() - self.started)


@contextmanager
def _transaction(writes: bool) -> Iterator[None]:
    """One batch's transaction; reads that write nothing need none elsewhere (SQLite's would take the
    write lock). On PostgreSQL, without JIT: the correlated subqueries inflate the planner's costs
    past JIT's thresholds, and compiling cost more than running (1.8 s against 0.3 s for the
    reference scan of a dry run over 10,000 runs)."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL jit = off")
            yield
    elif writes:
        with transaction.atomic():
            yield
    else:
        yield


def _page(rows: QuerySet[Any], after: Any, size: int, lock: bool) -> list[Any]:
    """The next ``size`` primary keys of ``rows`` after ``after``, locked (skipping rows others
    hold) in a real prune: keyset paging, so a row the delete refused is not selected again."""
    if after is not None:
        rows = rows.filter(pk__gt=after)
    rows = rows.order_by("pk")
    if lock:
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return list(rows.values_list("pk", flat=True)[:size])


def _prune_runs(retention: Retention, report: PruneReport, batch_size: int) -> None:
    deletable = Run.objects.filter(retention.deletable())
    after = None
    while True:
        with _Batch(report) as batch, _transaction(not report.dry_run):
            ids = _page(deletable, after, batch_size, lock=not report.dry_run)
            if not ids:
                return
            batch.rows = len(ids)
            after = ids[-1]
            if retention.threads and not report.dry_run:
                ids = _outside_busy_threads(ids)
            sizes = _measure_runs(ids)
            if report.dry_run:
                gone = set(ids)
            else:
                # The re-check: a run that stopped being deletable since its selection stays.
                deleted = deletable.filter(pk__in=ids)._raw_delete(deletable.db)
                gone = set(ids)
                if deleted != len(ids):
                    gone -= set(Run.objects.filter(pk__in=ids).values_list("pk", flat=True))
                # The child runs they started, and theirs, go with them (their rows were not
                # measured: the report counts the runs selected).
                family = descendants(*gone)
                if family:
                    Run.objects.filter(pk__in=family)._raw_delete(deletable.db)
                # Django's foreign keys are deferred: the children may go after their run, in the
                # same transaction.
                for model in CHILDREN:
                    model._default_manager.filter(run_id__in=[*gone, *family]).delete()
            for (name, run_id), (rows, size) in sizes.items():
                if run_id in gone:
                    report.add(name, rows, size)


def _outside_busy_threads(ids: list[str]) -> list[str]:
    """``ids`` less the runs of threads whose row another transaction holds: a run is being started
    in that thread (``creating.thread_for``), and it continues from the history these runs carry.
    The other threads' rows stay locked until the batch commits, so no run starts in them before the
    delete re-checks that none did."""
    keys = set(Run.objects.filter(pk__in=ids, thread__isnull=False).values_list("scope", "thread"))
    if not keys:
        return ids
    of_runs = Q(pk__in=[])
    for scope, name in keys:
        of_runs |= Q(scope=scope, name=name)
    rows = Thread.objects.filter(of_runs)
    free = set(rows.select_for_update(skip_locked=True).values_list("scope", "name"))
    busy = set(rows.values_list("scope", "name")) - free
    if not busy:
        return ids
    in_busy = Q(pk__in=[])
    for scope, name in busy:
        in_busy |= Q(scope=scope, thread=name)
    return list(Run.objects.filter(pk__in=ids).exclude(in_busy).values_list("pk", flat=True))


def _measure_runs(ids: list[str]) -> dict[tuple[str, str], tuple[int, int]]:
    """(model name, run id) -> (rows, bytes) of the runs ``ids`` and their children; bytes 0 off
    PostgreSQL."""
    if connection.vendor == "postgresql":
        parts = []
        params: list[Any] = []
        measured: tuple[type[Model], ...] = (Run, *CHILDREN)
        for model in measured:
            table = connection.ops.quote_name(model._meta.db_table)
            key = "id" if model is Run else "run_id"
            parts.append(
                f"SELECT %s, t.{key}, count(*), sum(pg_column_size(t.*)) FROM {table} t "
                f"WHERE t.{key} = ANY(%s) GROUP BY t.{key}"
            )
            params += [model.__name__, ids]
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            return {(name, run_id): (int(rows), int(size)) for name, run_id, rows, size in cursor.fetchall()}
    sizes = {
        ("Run", run_id): (1, 0) for run_id in Run.objects.filter(pk__in=ids).values_list("pk", flat=True)
    }
    for model in CHILDREN:
        counts = model._default_manager.filter(run_id__in=ids).values("run_id").annotate(n=Count("pk"))
        sizes.update({(model.__name__, c["run_id"]): (c["n"], 0) for c in counts})
    return sizes


def _row_bytes(model: type[Model], pks: list[Any]) -> int:
    """The stored size of these rows of ``model`` (PostgreSQL; 0 elsewhere)."""
    if connection.vendor != "postgresql" or not pks:
        return 0
    table = connection.ops.quote_name(model._meta.db_table)
    pk = connection.ops.quote_name(model._meta.pk.attname)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t WHERE t.{pk} = ANY(%s)", [pks]
        )
        return int(cursor.fetchone()[0])


def _prune_threads(
    retention: Retention, report: PruneReport, remaining: QuerySet[Run], batch_size: int
) -> None:
    """Thread rows older than the cutoff that no (remaining) run names. The rows are locked (SKIP
    LOCKED) before the delete checks, in a statement of its own and so with a fresh snapshot, that
    no run names them: a run committed in the thread meanwhile keeps its row. A run is inserted in a
    thread only under its row's lock (``creating.thread_for``): one being started is passed over,
    and one that starts after the lock waits for this batch, then creates the row afresh."""
    empty = Thread.objects.filter(created_at__lt=retention.cutoff()).exclude(
        Exists(remaining.filter(thread=OuterRef("name"), scope=OuterRef("scope")))
    )
    after = None
    while True:
        with _Batch(report) as batch, _transaction(not report.dry_run):
            pks = _page(empty, after, batch_size, lock=not report.dry_run)
            if not pks:
                return
            batch.rows = len(pks)
            after = pks[-1]
            size = _row_bytes(Thread, pks)
            rows = len(pks) if report.dry_run else empty.filter(pk__in=pks).delete()[0]
            report.add("Thread", rows, size)


def _prune_artifacts(
    retention: Retention, report: PruneReport, remaining: QuerySet[Run], batch_size: int
) -> None:
    old = Artifact.objects.filter(created_at__lt=retention.cutoff())
    if not old.exists():
        return
    scan_started = time.monotonic()
    with _transaction(writes=False):
        referenced = referenced_artifacts(remaining)
    doomed = [pk for pk in old.order_by("pk").values_list("pk", flat=True) if pk not in referenced]
    for start in range(0, len(doomed), batch_size):
        with _Batch(report) as timed, _transaction(not report.dry_run):
            # Runs started since the scan may have attached one of these: they keep it.
            since = timedelta(seconds=time.monotonic() - scan_started) + START_MARGIN
            fresh = attached(Run.objects.filter(created_at__gte=db_now_plus(-since)))
            batch = old.filter(pk__in=doomed[start : start + batch_size]).exclude(pk__in=fresh)
            if not report.dry_run:
                batch = batch.select_for_update(skip_locked=True)
            rows = list(batch.values_list("pk", "file", "size"))
            timed.rows = len(rows)
            pks = [pk for pk, _, _ in rows]
            size = _row_bytes(Artifact, pks)
            if not report.dry_run:
                old.filter(pk__in=pks).delete()
            files = [(name, file_size) for _, name, file_size in rows if name]
        report.add("Artifact", len(rows), size)
        report.files += len(files)
        report.file_bytes += sum(file_size for _, file_size in files)
        if not report.dry_run:
            # After the rows' commit: a file without its row is only lost space, a row without its
            # file would fail the run that reads it.
            report.file_errors += _delete_files([name for name, _ in files])


def _delete_files(names: list[str]) -> list[str]:
    storage = Artifact._meta.get_field("file").storage
    errors = []
    for name in names:
        try:
            storage.delete(name)
        # Storages raise their own errors (S3's are not OSError); the row is gone already, and the
        # other files must still go.
        except Exception as exc:
            errors.append(f"{name}: {exc}")
    return errors
