"""The only writer of run state. Every conditional write lives here and says whether it applied.

Rules of ownership, on one screen:

- A status changes only along ``core.states.TRANSITIONS``: every update filters on the sources of
  its target status, so a write that arrives late matches no row.
- An execution holds a claim (owner, attempt). ``attempt`` is a fencing token that grows with every
  claim; every write of an execution filters on status ``running``, owner and attempt, so a worker
  that froze past its lease and woke up writes nothing (zero rows -> ``LeaseLostError``).
- Lease expiry is computed by the database clock, never the worker's.
- Steps, checkpoint and usage of one model call are written in one transaction, whose first
  statement is the fenced update of the run row: that row lock also orders it against claims.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Q, Value
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from .core.messages import answer_open_calls, tool_result
from .core.states import CLAIMABLE, TERMINAL, Status, sources_of
from .core.types import NO_USAGE, Message, Usage
from .errors import DecisionRefused, LeaseLostError, RunNotFound
from .faults import crash_point
from .models import Checkpoint, EffectRecord, Run, RunInput, Step, Thread, WaitPoint


@dataclass(frozen=True)
class Claim:
    run_id: str
    owner: str
    attempt: int
    resumed: bool
    """True when an earlier execution had started the run (recovery, decision, drain)."""


@dataclass
class StepRecord:
    index: int
    kind: str
    name: str = ""
    input: Any = None
    output: Any = None
    error: str = ""
    started_at: datetime = field(default_factory=timezone.now)
    finished_at: datetime | None = None


def _in_seconds(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())


def _to(target: Status) -> Q:
    """Rows from which ``target`` is a legal transition."""
    return Q(status__in=[s.value for s in sources_of(target)])


def _held(claim: Claim) -> Q:
    return Q(pk=claim.run_id, status=Status.RUNNING, claim_owner=claim.owner, attempt=claim.attempt)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- creating ----------------------------------------------------------------------------------


def thread_for(name: str, creator: Any) -> Thread:
    """The thread called ``name``; created, owned by ``creator`` (None: nobody), if it is new."""
    thread = Thread.objects.filter(name=name).first()
    if thread is not None:
        return thread
    try:
        with transaction.atomic():
            return Thread.objects.create(name=name, owner=creator)
    except IntegrityError:
        # A concurrent first run of the thread won the insert: its creator owns the thread.
        return Thread.objects.get(name=name)


def create_run(**fields: Any) -> tuple[Run, bool]:
    """Insert a queued run. With a trigger id already used for this agent in this scope, return the
    first run."""
    trigger_id = fields.get("trigger_id")
    same = {"agent": fields["agent"], "scope": fields.get("scope", ""), "trigger_id": trigger_id}
    if trigger_id is not None:
        existing = Run.objects.filter(**same).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            return Run.objects.create(status=Status.QUEUED, **fields), True
    except IntegrityError:
        if trigger_id is None:
            raise
        # A concurrent start with the same trigger id won the insert.
        return Run.objects.get(**same), False


# --- claiming ----------------------------------------------------------------------------------


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


def _blocked(run: Run) -> bool:
    if not run.concurrency_key and not run.thread:
        return False
    return (
        Run.objects.filter(pk=run.pk)
        .filter(waits_for_elder("concurrency_key") | waits_for_elder("thread"))
        .exists()
    )


def claim(run_id: str, owner: str, lease_seconds: float) -> Claim | None:
    """Take the run for one execution. None: it is terminal, waiting, held by a live lease, locked
    by a concurrent claimer, or blocked by its concurrency key or thread."""
    with transaction.atomic():
        free = Q(claim_owner__isnull=True) | Q(claim_expires_at__lt=Now())
        run = (
            Run.objects.select_for_update(skip_locked=True)
            .filter(free, pk=run_id, status__in=[s.value for s in CLAIMABLE])
            .only("id", "status", "concurrency_key", "thread", "created_at", "started_at", "attempt")
            .first()
        )
        if run is None:
            return None
        if run.status == Status.QUEUED and _blocked(run):
            return None
        updated = (
            Run.objects.filter(free, pk=run_id, status=run.status)
            .filter(_to(Status.RUNNING) | Q(status=Status.RUNNING))
            .update(
                status=Status.RUNNING,
                claim_owner=owner,
                claim_expires_at=_in_seconds(lease_seconds),
                attempt=F("attempt") + 1,
                started_at=Coalesce(F("started_at"), Now()),
                updated_at=Now(),
            )
        )
        if not updated:
            return None
        return Claim(run_id, owner, run.attempt + 1, resumed=run.started_at is not None)


def renew(claim: Claim, lease_seconds: float) -> bool:
    """Extend the lease. False: the claim is lost (someone else holds the run, or it settled)."""
    return bool(Run.objects.filter(_held(claim)).update(claim_expires_at=_in_seconds(lease_seconds)))


# --- writing an execution's progress -----------------------------------------------------------


def _write_steps(claim: Claim, steps: Iterable[StepRecord]) -> None:
    """Inside the step's transaction: a duplicate index aborts it and LeaseLostError rolls it back."""
    rows = [
        Step(
            run_id=claim.run_id,
            index=s.index,
            kind=s.kind,
            name=s.name,
            input=s.input,
            output=s.output,
            error=s.error,
            attempt=claim.attempt,
            started_at=s.started_at,
            finished_at=s.finished_at or timezone.now(),
        )
        for s in steps
    ]
    try:
        Step.objects.bulk_create(rows)
    except IntegrityError:
        # A step index is recorded once; a duplicate means another execution got there first.
        raise LeaseLostError(f"run {claim.run_id}: step already recorded by another execution") from None


def _write_checkpoint(run_id: str, step_index: int, messages: list[Message], finish_reason: str) -> None:
    updated = Checkpoint.objects.filter(run_id=run_id, step_index__lte=step_index).update(
        step_index=step_index, messages=messages, finish_reason=finish_reason or "", created_at=timezone.now()
    )
    if not updated:
        Checkpoint.objects.create(
            run_id=run_id, step_index=step_index, messages=messages, finish_reason=finish_reason or ""
        )


def _record(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    finish_reason: str,
    usage: Usage,
    model_calls: int,
    consumed_inputs: Iterable[str],
    **run_fields: Any,
) -> int:
    """Inside a transaction: the fenced run update (usage, plus ``run_fields``), the steps, the
    checkpoint at the last step's index, and the inputs those steps took. Returns that index."""
    updated = Run.objects.filter(_held(claim)).update(
        input_tokens=F("input_tokens") + usage.input_tokens,
        output_tokens=F("output_tokens") + usage.output_tokens,
        model_calls=F("model_calls") + model_calls,
        updated_at=Now(),
        **run_fields,
    )
    if not updated:
        raise LeaseLostError(f"run {claim.run_id}: claim lost before saving steps")
    _write_steps(claim, steps)
    last = max(s.index for s in steps)
    _write_checkpoint(claim.run_id, last, messages, finish_reason)
    inputs = list(consumed_inputs)
    if inputs:
        RunInput.objects.filter(run_id=claim.run_id, pk__in=inputs, consumed_step__isnull=True).update(
            consumed_step=min(s.index for s in steps)
        )
    return last


def save_step(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    finish_reason: str = "",
    usage: Usage = NO_USAGE,
    model_calls: int = 0,
    consumed_inputs: Iterable[str] = (),
) -> None:
    """Steps + checkpoint + usage of one model call (or of tools run after a decision), atomically.
    Raises LeaseLostError, writing nothing, when the claim is no longer held."""
    with transaction.atomic():
        _record(claim, steps, messages, finish_reason, usage, model_calls, consumed_inputs)
        crash_point("before_step_commit")
    crash_point("after_step_commit")


def open_wait(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    tool_call_id: str,
    tool_name: str,
    tool_input: Any,
    ttl: timedelta,
    usage: Usage = NO_USAGE,
    model_calls: int = 0,
    consumed_inputs: Iterable[str] = (),
) -> WaitPoint:
    """Record the step that asks for approval, open a WaitPoint, move to ``waiting`` and release the
    claim, atomically. The returned wait point carries the raw token in memory only."""
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        wait_index = _record(
            claim,
            steps,
            messages,
            "tool_calls",
            usage,
            model_calls,
            consumed_inputs,
            status=Status.WAITING,
            claim_owner=None,
            claim_expires_at=None,
        )
        waitpoint = WaitPoint.objects.create(
            run_id=claim.run_id,
            step_index=wait_index,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            input=tool_input,
            expires_at=timezone.now() + ttl,
            token_hash=hash_token(token),
        )
    waitpoint.token = token
    return waitpoint


def back_to_waiting(claim: Claim) -> bool:
    """A claimed run whose checkpoint ends on an undecided approval goes back to waiting."""
    return bool(
        Run.objects.filter(_held(claim)).update(
            status=Status.WAITING, claim_owner=None, claim_expires_at=None, updated_at=Now()
        )
    )


def settle(
    claim: Claim,
    status: Status,
    *,
    output: Any = None,
    error_code: str = "",
    error_message: str = "",
    close_history: str | None = None,
) -> bool:
    """Final write of an execution: a terminal status, or ``interrupted``. Releases the claim.
    ``close_history`` answers open tool calls in the checkpoint with that text, so a thread can
    always continue. False: the claim was lost and nothing was written."""
    fields: dict[str, Any] = {
        "status": status,
        "claim_owner": None,
        "claim_expires_at": None,
        "updated_at": Now(),
    }
    if status in TERMINAL:
        fields.update(output=output, error_code=error_code, error_message=error_message, finished_at=Now())
    with transaction.atomic():
        if not Run.objects.filter(_held(claim)).filter(_to(status)).update(**fields):
            return False
        if close_history is not None:
            _close_history(claim.run_id, close_history)
    return True


def _close_history(run_id: str, reason: str) -> None:
    checkpoint = Checkpoint.objects.filter(run_id=run_id).first()
    if checkpoint is not None:
        closed = answer_open_calls(checkpoint.messages, reason)
        if len(closed) != len(checkpoint.messages):
            _write_checkpoint(run_id, checkpoint.step_index, closed, checkpoint.finish_reason)


# --- steering from outside an execution --------------------------------------------------------


def cancel(run_id: str) -> str:
    """Cancel from any process. Returns the status the run has afterwards: ``cancelled`` at once when
    no worker holds it; ``running`` with ``cancel_requested`` set when its owner must abort it; the
    terminal status unchanged when it had already settled."""
    with transaction.atomic():
        unheld = Q(claim_owner__isnull=True) | Q(claim_expires_at__lt=Now())
        if Run.objects.filter(_to(Status.CANCELLED), unheld, pk=run_id).update(
            status=Status.CANCELLED,
            cancel_requested=True,
            claim_owner=None,
            claim_expires_at=None,
            finished_at=Now(),
            updated_at=Now(),
        ):
            WaitPoint.objects.filter(run_id=run_id, decision__isnull=True).update(
                decision=WaitPoint.Decision.DENIED, decided_at=timezone.now(), reason="run cancelled"
            )
            _close_history(run_id, "The run was cancelled before this tool call ran.")
            return Status.CANCELLED
        Run.objects.filter(pk=run_id, status=Status.RUNNING).update(cancel_requested=True, updated_at=Now())
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status is None:
        raise RunNotFound(run_id)
    return status


def add_input(run_id: str, payload: Any) -> RunInput:
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).only("status").first()
        if run is None:
            raise RunNotFound(run_id)
        if run.status in TERMINAL:
            raise DecisionRefused(f"run {run_id} is {run.status}; it takes no more input", code="run_settled")
        return RunInput.objects.create(run_id=run_id, payload=payload)


def decide(
    approval_id: str, decision: str, *, by: Any = None, reason: str = "", token: str | None = None
) -> WaitPoint:
    """Record an approval decision once. Approved: the run goes back to ``running`` (unclaimed) and
    its next execution runs the tool. Denied or expired: the tool's result in the checkpoint (same
    step index, replacing it) tells the model so. Raises DecisionRefused (``not_found``,
    ``already_decided``, ``expired``, ``bad_token``)."""
    with transaction.atomic():
        waitpoint = WaitPoint.objects.select_for_update().filter(approval_id=approval_id).first()
        if waitpoint is None:
            raise DecisionRefused(f"no approval {approval_id}", code="not_found")
        if token is not None and not secrets.compare_digest(hash_token(token), waitpoint.token_hash):
            raise DecisionRefused("this token does not decide this approval", code="bad_token")
        if waitpoint.decision is not None:
            code = "expired" if waitpoint.decision == WaitPoint.Decision.EXPIRED else "already_decided"
            raise DecisionRefused(f"approval {approval_id} was already {waitpoint.decision}", code=code)
        if (
            decision != WaitPoint.Decision.EXPIRED
            and waitpoint.expires_at
            and waitpoint.expires_at <= timezone.now()
        ):
            raise DecisionRefused(f"approval {approval_id} expired at {waitpoint.expires_at}", code="expired")
        # The run row is locked before the wait point is closed, so a cancel cannot interleave.
        if not Run.objects.select_for_update().filter(pk=waitpoint.run_id, status=Status.WAITING).exists():
            raise DecisionRefused(f"run {waitpoint.run_id} is not waiting", code="already_decided")
        now = timezone.now()
        WaitPoint.objects.filter(pk=waitpoint.pk).update(
            decision=decision,
            decided_by=by if getattr(by, "pk", None) else None,
            decided_at=now,
            reason=reason,
        )
        if decision != WaitPoint.Decision.APPROVED:
            checkpoint = Checkpoint.objects.get(run_id=waitpoint.run_id)
            verdict = "denied" if decision == WaitPoint.Decision.DENIED else "expired without a decision"
            text = f"The call to {waitpoint.tool_name} was not run: approval {verdict}."
            if reason:
                text += f" Reason: {reason}"
            _write_checkpoint(
                waitpoint.run_id,
                checkpoint.step_index,
                [*checkpoint.messages, tool_result(waitpoint.tool_call_id, text)],
                checkpoint.finish_reason,
            )
        Run.objects.filter(_to(Status.RUNNING), pk=waitpoint.run_id, status=Status.WAITING).update(
            status=Status.RUNNING, updated_at=Now()
        )
        waitpoint.refresh_from_db()
    return waitpoint


def fail_expired_wait(approval_id: str) -> bool:
    """For agents that fail rather than deny on expiry: waiting -> failed (``approval_expired``)."""
    with transaction.atomic():
        waitpoint = (
            WaitPoint.objects.select_for_update().filter(approval_id=approval_id, decision=None).first()
        )
        if waitpoint is None:
            return False
        WaitPoint.objects.filter(pk=waitpoint.pk).update(
            decision=WaitPoint.Decision.EXPIRED, decided_at=timezone.now()
        )
        updated = Run.objects.filter(_to(Status.FAILED), pk=waitpoint.run_id, status=Status.WAITING).update(
            status=Status.FAILED,
            error_code="approval_expired",
            error_message=f"approval {approval_id} for {waitpoint.tool_name} expired",
            finished_at=Now(),
            updated_at=Now(),
        )
        if updated:
            _close_history(waitpoint.run_id, "The call was not run: its approval expired.")
        return bool(updated)


def mark_notified(waitpoint: WaitPoint) -> bool:
    return bool(
        WaitPoint.objects.filter(pk=waitpoint.pk, notified_at__isnull=True).update(notified_at=timezone.now())
    )


def reissue_token(waitpoint: WaitPoint) -> str:
    """Mint a new token for a re-sent notification; only the latest is valid."""
    token = secrets.token_urlsafe(32)
    WaitPoint.objects.filter(pk=waitpoint.pk, decision__isnull=True).update(token_hash=hash_token(token))
    return token


# --- effect tools ------------------------------------------------------------------------------


def effect_record(claim: Claim, key: str) -> EffectRecord | None:
    """Inside an atomic block: lock the run row if the claim is still held (LeaseLostError if not)
    and return the record of ``key`` if the effect already ran."""
    if not Run.objects.select_for_update().filter(_held(claim)).exists():
        raise LeaseLostError(f"run {claim.run_id}: claim lost before an effect tool")
    return EffectRecord.objects.filter(run_id=claim.run_id, key=key).first()


def record_effect(claim: Claim, key: str, tool_name: str, tool_input: Any, output: Any, error: str) -> None:
    EffectRecord.objects.create(
        run_id=claim.run_id, key=key, tool_name=tool_name, input=tool_input, output=output, error=error
    )
