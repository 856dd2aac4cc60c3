"""The SQL pieces every conditional write is built from: the fence of a claim, the legal sources of
a transition, and times taken from the database's clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

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
    same = {field_name: OuterRef(field_name)}
    if field_name == "concurrency_key":
        same["scope"] = OuterRef("scope")
    return Exists(
        Run.objects.filter(**same)
        .exclude(pk=OuterRef("pk"))
        .filter(
            Q(status__in=[Status.RUNNING, Status.WAITING, Status.INTERRUPTED])
            | (Q(status=Status.QUEUED) & elder)
        )
    )
