"""The SQL pieces every conditional write is built from: the fence of a claim, the legal sources of
a transition, times taken from the database's clock, and a run's effect lock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Exists, ExpressionWrapper, OuterRef, Q, Value
from django.db.models.functions import Now

from ..core.records import Claim
from ..core.states import Status, sources_of
from ..models import Run


def db_now_plus(delta: timedelta) -> ExpressionWrapper:
    """A time computed by the database's clock: hosts' clocks disagree, the database's is one."""
    return ExpressionWrapper(Now() + Value(delta), output_field=DateTimeField())


def in_seconds(seconds: float) -> ExpressionWrapper:
    return db_now_plus(timedelta(seconds=seconds))


def to(target: Status) -> Q:
    """Rows from which ``target`` is a legal transition (``core.states.TRANSITIONS``)."""
    return Q(status__in=[s.value for s in sources_of(target)])


def free() -> Q:
    """Run rows no live claim holds: none names them, or its lease ran out by the database's clock."""
    return Q(claim_owner__isnull=True) | Q(claim_expires_at__lt=Now())


def admissible() -> Q:
    """Runs not held back by an elder of their concurrency key or thread (only a queued run is: the
    elder's settle admits it)."""
    return ~Q(status=Status.QUEUED) | (~waits_for_elder("concurrency_key") & ~waits_for_elder("thread"))


def held(claim: Claim) -> Q:
    """The run row as long as this claim holds it: running, same owner, same attempt."""
    return Q(pk=claim.run_id, status=Status.RUNNING, claim_owner=claim.owner, attempt=claim.attempt)


def update_held(
    claim: Claim, *, unless_cancelled: bool = False, where: Q | None = None, **fields: Any
) -> bool:
    """The fenced update of an execution's run row. False: the claim is lost, or (with
    ``unless_cancelled``, every write that keeps a run going) a cancel was requested, which wins
    over everything but a terminal settle. Either way nothing was written; an execution told False
    tries to settle ``cancelled``, which is refused in turn only if the claim is lost."""
    rows = Run.objects.filter(held(claim), where or Q())
    if unless_cancelled:
        rows = rows.filter(cancel_requested=False)
    return bool(rows.update(**fields))


def waits_for_elder(field_name: str) -> Exists:
    """Another run of the same concurrency key (or thread) is active, or queued and older. Creation
    order is total (ties broken by id), so of two racing claims at most one sees no elder."""
    elder = Q(created_at__lt=OuterRef("created_at")) | Q(
        created_at=OuterRef("created_at"), id__lt=OuterRef("id")
    )
    # Keys and threads are named within a scope (``Thread``).
    same = {field_name: OuterRef(field_name), "scope": OuterRef("scope")}
    return Exists(
        Run.objects.filter(**same)
        .exclude(pk=OuterRef("pk"))
        .filter(
            Q(status__in=[Status.RUNNING, Status.WAITING, Status.INTERRUPTED])
            | (Q(status=Status.QUEUED) & elder)
        )
    )


# The first key of chamvi_runs's advisory locks ("chmv"); the second is the hash of the run id. Two
# runs whose ids hash alike share one lock: an effect of one delays the other's effect or claim,
# which costs time, never a guarantee.
EFFECT_LOCK_KEY = 0x63686D76


def effect_lock(run_id: str, *, wait: bool) -> bool:
    """Inside a transaction: the run's effect lock, an advisory lock held until the transaction
    ends. An effect tool takes it waiting (``wait``); a claim or a cancel only tries it, and False
    means an effect of the run is in flight. The run row is not locked: lease renewals and cancels,
    which update that row, never wait for an effect tool.

    SQLite has no such lock, nor needs one: its transactions (``IMMEDIATE``) hold the database's
    write lock until they commit, so no claim or cancel is written while an effect tool runs. There
    this takes nothing and says True."""
    if connection.vendor != "postgresql":
        return True
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, hashtext(%s))", [EFFECT_LOCK_KEY, run_id])
        (taken,) = cursor.fetchone()
    return wait or bool(taken)
