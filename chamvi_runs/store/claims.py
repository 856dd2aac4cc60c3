"""Claiming a run for one execution, and keeping the claim: lease renewal and the model-call count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now

from ..core.records import Claim, lacks_version
from ..core.states import CLAIMABLE, Status, sources_of
from ..core.types import NO_USAGE, Usage
from ..models import Run, RunInput
from . import step_sql
from .fence import effect_lock, free, held, in_seconds, update_held, waits_for_elder
from .queries import pending_inputs


def _blocked(run_id: str, concurrency_key: str | None, thread: str | None) -> bool:
    if not concurrency_key and not thread:
        return False
    return (
        Run.objects.filter(pk=run_id)
        .filter(waits_for_elder("concurrency_key") | waits_for_elder("thread"))
        .exists()
    )


class _Free(NamedTuple):
    """What a claim reads of a run no live claim holds."""

    status: str
    concurrency_key: str | None
    thread: str | None
    started_at: datetime | None
    attempt: int
    stalled_executions: int
    cancel_requested: bool
    claim_owner: str | None
    agent: str
    agent_version: str


# A claim's two statements on PostgreSQL (``step_sql.applies``), as the ORM builds them elsewhere: the run is
# free when no claim names it or its lease ran out by the database's clock. The take counts a
# stalled execution now, reset by the execution's first write: an execution that dies before
# writing anything (its tool killed the worker) stays counted.
_FREE = """
SELECT status, concurrency_key, thread, started_at, attempt, stalled_executions, cancel_requested,
    claim_owner, agent, agent_version
FROM {run}
WHERE id = %s AND status = ANY(%s) AND (claim_owner IS NULL OR claim_expires_at < STATEMENT_TIMESTAMP())
FOR UPDATE SKIP LOCKED
"""
_TAKE = """
UPDATE {run} SET status = %s, claim_owner = %s,
    claim_expires_at = STATEMENT_TIMESTAMP() + make_interval(secs => %s),
    attempt = attempt + 1, stalled_executions = stalled_executions + 1,
    started_at = COALESCE(started_at, STATEMENT_TIMESTAMP()), updated_at = STATEMENT_TIMESTAMP()
WHERE id = %s AND status = %s AND status = ANY(%s)
    AND (claim_owner IS NULL OR claim_expires_at < STATEMENT_TIMESTAMP())
RETURNING {columns}
"""


def _free_row(run_id: str) -> _Free | None:
    """Inside the claim's transaction: the run, locked, if it is claimable and free; None when it
    is not, or another claimer holds its row (SKIP LOCKED)."""
    claimable = [s.value for s in CLAIMABLE]
    if step_sql.applies():
        with connection.cursor() as cursor:
            cursor.execute(_FREE.format(run=Run._meta.db_table), [run_id, claimable])
            row = cursor.fetchone()
        return None if row is None else _Free(*row)
    row = (
        Run.objects.select_for_update(skip_locked=True)
        .filter(free(), pk=run_id, status__in=claimable)
        .values_list(*_Free._fields)
        .first()
    )
    return None if row is None else _Free(*row)


def _take(run_id: str, status: str, owner: str, lease_seconds: float) -> Run | bool:
    """The claim's write, from ``status`` (the locked row's): a running run keeps its status (no
    transition); any other becomes running, as the table allows. On PostgreSQL, the run as the
    write left it (the execution reads it no more); elsewhere, whether it applied."""
    legal = [Status.RUNNING] if status == Status.RUNNING else sources_of(Status.RUNNING)
    if step_sql.applies():
        with connection.cursor() as cursor:
            cursor.execute(
                _TAKE.format(run=Run._meta.db_table, columns=step_sql.run_columns()),
                [
                    Status.RUNNING.value,
                    owner,
                    float(lease_seconds),
                    run_id,
                    status,
                    [s.value for s in legal],
                ],
            )
            row = cursor.fetchone()
        return False if row is None else step_sql.run_from_row(row)
    rows = Run.objects.filter(free(), pk=run_id, status=status, status__in=[s.value for s in legal])
    updated = rows.update(
        status=Status.RUNNING,
        claim_owner=owner,
        claim_expires_at=in_seconds(lease_seconds),
        attempt=F("attempt") + 1,
        stalled_executions=F("stalled_executions") + 1,
        started_at=Coalesce(F("started_at"), Now()),
        updated_at=Now(),
    )
    return bool(updated)


def claim(
    run_id: str, owner: str, lease_seconds: float, versions: Mapping[str, str] | None = None
) -> Claim | None:
    """Take the run for one execution. None: it is terminal, waiting, held by a live lease, locked
    by a concurrent claimer, blocked by its concurrency key or thread, of a version the claimer
    does not have (``versions``, agent -> version; None: any), or (PostgreSQL) an effect tool of an
    earlier execution is still inside its transaction (``fence.effect_lock``)."""
    with transaction.atomic():
        run = _free_row(run_id)
        if run is None or lacks_version(versions, run.agent, run.agent_version):
            return None
        if run.status == Status.QUEUED and _blocked(run_id, run.concurrency_key, run.thread):
            return None
        # Only an execution that holds a claim runs an effect tool, and only its holder releases a
        # claim: a run no claim names has none in flight. Taking over an expired one, the lock is
        # tried, never waited for, and held until this claim commits, so an effect that starts
        # meanwhile waits for it and then finds its own claim gone.
        if run.claim_owner is not None and not effect_lock(run_id, wait=False):
            return None
        taken = _take(run_id, run.status, owner, lease_seconds)
        if not taken:
            return None
        return Claim(
            run_id,
            owner,
            run.attempt + 1,
            resumed=run.started_at is not None,
            stalled=run.stalled_executions,
            cancel_requested=run.cancel_requested,
            row=taken if isinstance(taken, Run) else None,
        )


def renew(claim: Claim, lease_seconds: float, *, usage: Usage = NO_USAGE) -> bool:
    """Extend the lease, adding ``usage`` of a model call not saved yet (it counts against the
    budget even if this execution dies before saving it). False: the claim is lost (someone else
    holds the run, or it settled)."""
    if step_sql.applies():
        return step_sql.renew(claim, lease_seconds, usage)
    extra: dict[str, Any] = {}
    if usage.total:
        extra.update(
            input_tokens=F("input_tokens") + usage.input_tokens,
            output_tokens=F("output_tokens") + usage.output_tokens,
        )
    return update_held(claim, claim_expires_at=in_seconds(lease_seconds), **extra)


# Rows another transaction holds are passed over (SKIP LOCKED), never waited for: a step's write,
# a cancel or an input holds a run row for a moment (and a site's transaction around send_input for
# as long as it lasts); one execution's row must not hold up the renewal of every other.
_RENEW_MANY = """
WITH mine (id, owner, attempt) AS (
    SELECT * FROM unnest(%s::varchar[], %s::varchar[], %s::integer[])
), held AS (
    SELECT r.id FROM {run} r JOIN mine ON r.id = mine.id
    WHERE r.status = %s AND r.claim_owner = mine.owner AND r.attempt = mine.attempt
), locked AS (
    SELECT r.id FROM {run} r JOIN mine ON r.id = mine.id
    WHERE r.status = %s AND r.claim_owner = mine.owner AND r.attempt = mine.attempt
    FOR UPDATE OF r SKIP LOCKED
), renewed AS (
    UPDATE {run} SET claim_expires_at = statement_timestamp() + make_interval(secs => %s)
    WHERE id IN (SELECT id FROM locked)
)
SELECT id FROM held
"""


def renew_many(claims: Sequence[Claim], lease_seconds: float) -> set[str]:
    """Extend the leases of every claim in one statement (a worker process's lease keeper keeps all
    its executions' claims). Returns the run ids still held; the others' claims are lost.

    On PostgreSQL it waits on no lock: a row another transaction holds right now keeps its lease as
    it was this time (the next heartbeat renews it), and counts as held when its claim is, since
    the claim is what that row says when the statement begins. A lease is several heartbeats long."""
    if not claims:
        return set()
    if connection.vendor == "postgresql":
        sql = _RENEW_MANY.format(run=Run._meta.db_table)
        running = Status.RUNNING.value
        with connection.cursor() as cursor:
            cursor.execute(
                sql,
                [
                    [one.run_id for one in claims],
                    [one.owner for one in claims],
                    [one.attempt for one in claims],
                    running,
                    running,
                    float(lease_seconds),
                ],
            )
            return {row[0] for row in cursor.fetchall()}
    fence = Q(pk__in=[])
    for one in claims:
        fence |= held(one)
    if Run.objects.filter(fence).update(claim_expires_at=in_seconds(lease_seconds)) == len(claims):
        return {one.run_id for one in claims}
    # Some claim is lost: the fence still tells which rows are held (and were just renewed).
    return set(Run.objects.filter(fence).values_list("pk", flat=True))


_COUNT_AND_READ_INPUTS = """
WITH counted AS (
    UPDATE {run} SET model_calls = model_calls + 1
    WHERE id = %s AND status = %s AND claim_owner = %s AND attempt = %s
    RETURNING id
)
SELECT i.id, i.payload, i.created_at FROM counted
LEFT JOIN {input} i ON i.run_id = counted.id AND i.consumed_step IS NULL
ORDER BY i.created_at, i.id
"""


def start_model_call(claim: Claim) -> list[RunInput] | None:
    """Count a model call before it is made (``count_model_call``) and return the steering inputs
    waiting for it, oldest first. None: the claim is lost, and the call must not be made.

    On PostgreSQL both are one statement (a data-modifying CTE): a run makes one such round trip
    per model call instead of two."""
    if not step_sql.applies():
        if not count_model_call(claim):
            return None
        return pending_inputs(claim.run_id)
    sql = _COUNT_AND_READ_INPUTS.format(run=Run._meta.db_table, input=RunInput._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [claim.run_id, Status.RUNNING.value, claim.owner, claim.attempt])
        rows = cursor.fetchall()
    return None if not rows else step_sql.inputs_of(claim.run_id, rows)


def count_model_call(claim: Claim) -> bool:
    """Count a model call before it is made: a call whose execution dies unsaved still counts
    against ``max_steps``. False: the claim is lost, and the call must not be made."""
    return update_held(claim, model_calls=F("model_calls") + 1)
