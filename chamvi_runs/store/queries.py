"""Read-only selections of run state, for executions, the janitor and the pages. Writes live in the
other modules of ``store``."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any, TypeVar, cast

from django.db.models import (
    Case,
    CharField,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextChoices,
    Value,
    When,
)
from django.db.models.functions import Now

from ..core.branches import Node
from ..core.records import Decided
from ..core.states import Status
from ..core.types import Message
from ..models import Run, RunInput, Step, WaitPoint
from . import histories
from .fence import admissible, waits_for_elder
from .versions import ready, version_missing


def run(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


def checkpoint(run_id: str) -> tuple[list[Message], int] | None:
    """The run's history at its checkpoint, and the index of the step it was taken after."""
    return histories.history(run_id)


def thread_nodes(thread: str, scope: str) -> list[Node]:
    """The runs of a thread as its branch sees them (``core.branches``), in creation order."""
    rows = (
        Run.objects.filter(thread=thread, scope=scope)
        .order_by("created_at", "id")
        .values_list("id", "replaces_id", "base_id", "base_step")
    )
    return [
        Node(run_id, replaces, base if replaces is None else None, base_step == -1)
        for run_id, replaces, base, base_step in rows
    ]


def last_model_step(run_id: str, before: int | None = None) -> Step | None:
    """The run's latest ``llm`` step (before index ``before``, if given)."""
    steps = Step.objects.filter(run_id=run_id, kind=Step.Kind.LLM)
    if before is not None:
        steps = steps.filter(index__lt=before)
    return steps.order_by("-index").first()


def waiting_at(run_id: str, model_step: int, position: int) -> bool:
    """Whether a call of one model call, at ``position`` or after it, still waits for a decision."""
    return WaitPoint.objects.filter(
        run_id=run_id, model_step=model_step, call_position__gte=position, decision__isnull=True
    ).exists()


def decided_calls(run_id: str, model_step: int) -> dict[int, Decided]:
    """Position -> decision of the calls of one model call an execution resumes with: approved
    calls, questions answered or expired, and child runs settled. (A denied or expired approval is
    already answered in the history.)"""
    rows = WaitPoint.objects.filter(run_id=run_id, model_step=model_step).filter(
        Q(decision=WaitPoint.Decision.APPROVED)
        | Q(kind=WaitPoint.Kind.INPUT, decision__in=[WaitPoint.Decision.ANSWERED, WaitPoint.Decision.EXPIRED])
        | Q(kind=WaitPoint.Kind.CHILD, decision__in=[WaitPoint.Decision.ANSWERED, WaitPoint.Decision.FAILED])
    )
    fields = ("call_position", "kind", "decision", "arguments_hash", "approved_input", "answer", "reason")
    return {
        w.call_position: Decided(
            w.kind, w.decision or "", w.arguments_hash, w.approved_input, w.answer, w.reason
        )
        for w in rows.only(*fields)
    }


def cancels_among(run_ids: Collection[str]) -> set[str]:
    """Which of ``run_ids`` have a cancel requested: one read for every execution of a process."""
    if not run_ids:
        return set()
    return set(Run.objects.filter(pk__in=list(run_ids), cancel_requested=True).values_list("pk", flat=True))


def waiting_inputs(run_id: str) -> QuerySet[RunInput]:
    """The steering inputs no model call has taken yet, oldest first."""
    return RunInput.objects.filter(run_id=run_id, consumed_step__isnull=True)


def pending_inputs(run_id: str) -> list[RunInput]:
    return list(waiting_inputs(run_id))


def taken_inputs(run: Run, steps: list[Step]) -> dict[str, Any]:
    """Input id -> payload of the steering inputs the model calls of ``steps`` took."""
    ids = [i for s in steps if s.kind == Step.Kind.LLM for i in (s.input or {}).get("inputs") or []]
    return dict(RunInput.objects.filter(run=run, pk__in=ids).values_list("pk", "payload")) if ids else {}


def resumed_decision(run_id: str) -> WaitPoint | None:
    """The wait point whose decision (or expiry) an execution resumes after, for its ``run.resume``:
    decided, with no step saved after its wait step. A cancel settles the run: nothing resumes."""
    later = Step.objects.filter(run_id=OuterRef("run_id"), index__gt=OuterRef("step_index"))
    return (
        WaitPoint.objects.filter(run_id=run_id, decision__isnull=False)
        .exclude(decision=WaitPoint.Decision.CANCELLED)
        .filter(~Exists(later))
        .select_related("decided_by")
        .order_by("-created_at", "-pk")
        .first()
    )


def decided_waitpoints(run: Run) -> QuerySet[WaitPoint]:
    """The run's decided wait points, oldest first, with who decided."""
    decided = run.waitpoints.filter(decision__isnull=False).select_related("decided_by")
    return decided.order_by("created_at", "pk")


def lease_expired() -> Q:
    """Running, and its claim's lease ran out by the database's clock (a released claim has no expiry)."""
    return Q(status=Status.RUNNING, claim_expires_at__lt=Now())


def runs_to_enqueue(stale_after_seconds: float) -> list[str]:
    """Runs a worker should pick up: expired claims, released running runs, and queued or
    interrupted runs untouched for a while (their job may have been lost with Redis). A queued run
    behind an elder of its concurrency key or thread is left out: the elder's settle admits it, and
    so is a run of a version no live worker has (``versions.version_missing``)."""
    quiet = Q(
        updated_at__lt=ExpressionWrapper(
            Now() - Value(timedelta(seconds=stale_after_seconds)), output_field=DateTimeField()
        )
    )
    return list(
        Run.objects.filter(
            lease_expired()
            | (Q(status=Status.RUNNING, claim_owner__isnull=True) & quiet)
            | (Q(status__in=[Status.QUEUED, Status.INTERRUPTED]) & quiet)
        )
        .filter(admissible())
        # No live worker would take it: it waits for one of its version, or its agent's rule.
        .exclude(version_missing())
        .order_by("created_at")
        .values_list("pk", flat=True)[:500]
    )


def next_in_line(run: Run) -> list[str]:
    """The oldest queued run of each concurrency key and thread this run was holding."""
    ids = []
    for field_name in ("concurrency_key", "thread"):
        value = getattr(run, field_name)
        if value:
            same = {field_name: value, "scope": run.scope}
            first = (
                Run.objects.filter(**same, status=Status.QUEUED)
                .order_by("created_at", "id")
                .values_list("pk", flat=True)
                .first()
            )
            if first:
                ids.append(first)
    return ids


def expired_waitpoints(run_id: str | None = None) -> list[WaitPoint]:
    """Open wait points past their expiry, by the database's clock (of one run, if given)."""
    expired = WaitPoint.objects.filter(
        decision__isnull=True, expires_at__lt=Now(), run__status=Status.WAITING
    )
    if run_id is not None:
        expired = expired.filter(run_id=run_id)
    return list(expired.select_related("run")[:500])


class Stuck(TextChoices):
    """Why ``stuck_runs`` lists a run."""

    LEASE_EXPIRED = "lease_expired", "lease expired"
    QUEUED = "queued", "queued too long"
    APPROVAL_EXPIRED = "approval_expired", "approval expired"
    CHILD_STUCK = "child_stuck", "waiting on a stuck child run"
    VERSION = "version", "waiting for an agent version no worker has"


R = TypeVar("R", bound=Run)


def stuck_runs(runs: QuerySet[R], queued_after: timedelta) -> QuerySet[R]:
    """Those of ``runs`` that nothing is moving on, by the database's clock: ready for a worker while
    no live worker has their agent version (SPEC §14), running with an expired lease (its worker
    died), queued for longer than ``queued_after``, or waiting on an open approval past its expiry.
    A queued run behind an elder of its concurrency key or thread is not stuck: the elder's settle
    admits it (the elder is listed if it is stuck itself).

    Each row is annotated with ``stuck_reason`` (a ``Stuck``), ``stuck_since`` (when its lease or
    approval expired, when it was created, or, waiting for a version, when it was last written) and
    ``stuck_for`` (the database's now minus that)."""
    expired_approval = WaitPoint.objects.filter(
        run=OuterRef("pk"), decision__isnull=True, expires_at__lt=Now()
    )
    queued_before = ExpressionWrapper(Now() - Value(queued_after), output_field=DateTimeField())
    stuck_child = _stuck_child(queued_before)
    missing = ready() & version_missing()
    stuck = (
        missing
        | lease_expired()
        | (
            Q(status=Status.QUEUED, created_at__lt=queued_before)
            & ~waits_for_elder("concurrency_key")
            & ~waits_for_elder("thread")
        )
        | (Q(status=Status.WAITING) & (Exists(expired_approval) | Exists(stuck_child)))
    )
    # The filter leaves one reason per status (a waiting run: its expired approval, else its child).
    annotated = (
        runs.filter(stuck)
        .annotate(
            stuck_reason=Case(
                When(missing, then=Value(Stuck.VERSION.value)),
                When(status=Status.RUNNING, then=Value(Stuck.LEASE_EXPIRED.value)),
                When(status=Status.QUEUED, then=Value(Stuck.QUEUED.value)),
                When(Exists(expired_approval), then=Value(Stuck.APPROVAL_EXPIRED.value)),
                default=Value(Stuck.CHILD_STUCK.value),
                output_field=CharField(),
            ),
            stuck_since=Case(
                # Since it was last touched: queued, decided or released then.
                When(missing, then=F("updated_at")),
                When(status=Status.RUNNING, then=F("claim_expires_at")),
                When(status=Status.QUEUED, then=F("created_at")),
                When(Exists(expired_approval), then=Subquery(expired_approval.values("expires_at")[:1])),
                # Since it waits for the child (the child's own row says since when it is stuck).
                default=Subquery(stuck_child.values("created_at")[:1]),
                output_field=DateTimeField(),
            ),
            stuck_child=Subquery(stuck_child.values("child_id")[:1]),
        )
        .annotate(stuck_for=ExpressionWrapper(Now() - F("stuck_since"), output_field=DurationField()))
    )
    # django-stubs types an annotated queryset of R as one of Run: the rows are still R's.
    return cast("QuerySet[R]", annotated)


def _stuck_child(queued_before: ExpressionWrapper) -> QuerySet[WaitPoint]:
    """The open waits of a run (``OuterRef("pk")``) for a child run that is stuck itself: its lease
    expired, queued too long, or waiting on an expired approval or, one level down, on a child
    stuck the same way (delegation is at most ``MAX_CHILD_DEPTH`` deep; the deepest stuck run is
    listed for itself)."""

    def stuck(prefix: str) -> Q:
        expired = WaitPoint.objects.filter(
            run=OuterRef(f"{prefix}child"), decision__isnull=True, expires_at__lt=Now()
        )
        waiting_on_expiry = Q(**{f"{prefix}child__status": Status.WAITING}) & Q(Exists(expired))
        return (
            Q(**{f"{prefix}child__status": Status.RUNNING, f"{prefix}child__claim_expires_at__lt": Now()})
            | Q(**{f"{prefix}child__status": Status.QUEUED, f"{prefix}child__created_at__lt": queued_before})
            | waiting_on_expiry
        )

    grandchild = WaitPoint.objects.filter(
        Q(run=OuterRef("child"), kind=WaitPoint.Kind.CHILD, decision__isnull=True) & stuck("")
    )
    return WaitPoint.objects.filter(
        Q(run=OuterRef("pk"), kind=WaitPoint.Kind.CHILD, decision__isnull=True)
        & (stuck("") | (Q(child__status=Status.WAITING) & Exists(grandchild)))
    )


def unnotified_waitpoints() -> list[WaitPoint]:
    """Open wait points whose notifier has not returned yet and may be called now (none in flight,
    not backing off). A child run's wait asks nobody: it is never notified."""
    return list(
        WaitPoint.objects.filter(
            Q(next_notify_at__isnull=True) | Q(next_notify_at__lte=Now()),
            decision__isnull=True,
            notified_at__isnull=True,
            run__status=Status.WAITING,
        )
        .exclude(kind=WaitPoint.Kind.CHILD)
        .select_related("run")[:500]
    )
