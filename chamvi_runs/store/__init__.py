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
import json
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
from .core.nul import without_nul
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
    stalled: int = 0
    """Executions before this one, in a row, that ended without writing anything (they died)."""
    cancel_requested: bool = False


@dataclass(frozen=True)
class CallRef:
    """One tool call by its place: the model call's step and the call's position in it."""

    model_step: int
    position: int
    call_id: str


class CancelRequested(Exception):
    """A write that would keep the run going (open a wait point, go back to waiting) was refused
    because a cancel was requested: the execution settles ``cancelled`` instead."""


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


def _db_now_plus(delta: timedelta) -> ExpressionWrapper:
    """A time computed by the database's clock: hosts' clocks disagree, the database's is one."""
    return ExpressionWrapper(Now() + Value(delta), output_field=DateTimeField())


def _in_seconds(seconds: float) -> ExpressionWrapper:
    return _db_now_plus(timedelta(seconds=seconds))


def _to(target: Status) -> Q:
    """Rows from which ``target`` is a legal transition."""
    return Q(status__in=[s.value for s in sources_of(target)])


def _held(claim: Claim) -> Q:
    return Q(pk=claim.run_id, status=Status.RUNNING, claim_owner=claim.owner, attempt=claim.attempt)


def _update_held(
    claim: Claim, *, unless_cancelled: bool = False, where: Q | None = None, **fields: Any
) -> bool:
    """The fenced update of an execution's run row. False: the claim is lost. ``unless_cancelled``
    (every non-terminal transition): a requested cancel refuses it in the same statement and
    raises CancelRequested, because a cancel wins over everything but a terminal settle."""
    held = Run.objects.filter(_held(claim), where or Q())
    target = held.filter(cancel_requested=False) if unless_cancelled else held
    if target.update(**fields):
        return True
    if unless_cancelled and held.exists():
        raise CancelRequested(claim.run_id)
    return False


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
            .only(
                "id",
                "status",
                "scope",
                "concurrency_key",
                "thread",
                "created_at",
                "started_at",
                "attempt",
                "stalled_executions",
                "cancel_requested",
            )
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
                # Counted now, reset by the execution's first write: an execution that dies
                # before writing anything (its tool killed the worker) stays counted.
                stalled_executions=F("stalled_executions") + 1,
                started_at=Coalesce(F("started_at"), Now()),
                updated_at=Now(),
            )
        )
        if not updated:
            return None
        return Claim(
            run_id,
            owner,
            run.attempt + 1,
            resumed=run.started_at is not None,
            stalled=run.stalled_executions,
            cancel_requested=run.cancel_requested,
        )


def renew(claim: Claim, lease_seconds: float, *, usage: Usage = NO_USAGE) -> bool:
    """Extend the lease, adding ``usage`` of a model call not saved yet (it counts against the
    budget even if this execution dies before saving it). False: the claim is lost (someone else
    holds the run, or it settled)."""
    extra: dict[str, Any] = {}
    if usage.total:
        extra.update(
            input_tokens=F("input_tokens") + usage.input_tokens,
            output_tokens=F("output_tokens") + usage.output_tokens,
        )
    return _update_held(claim, claim_expires_at=_in_seconds(lease_seconds), **extra)


def count_model_call(claim: Claim) -> bool:
    """Count a model call before it is made: a call whose execution dies unsaved still counts
    against ``max_steps``. False: the claim is lost, and the call must not be made."""
    return _update_held(claim, model_calls=F("model_calls") + 1)


# --- writing an execution's progress -----------------------------------------------------------


def _write_steps(claim: Claim, steps: Iterable[StepRecord]) -> None:
    """Inside the step's transaction: a duplicate index aborts it and LeaseLostError rolls it back."""
    rows = [
        Step(
            run_id=claim.run_id,
            index=s.index,
            kind=s.kind,
            name=without_nul(s.name),
            input=without_nul(s.input),
            output=without_nul(s.output),
            error=without_nul(s.error),
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
    messages = without_nul(messages)
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
    consumed_inputs: Iterable[str],
    *,
    unless_cancelled: bool = False,
    **run_fields: Any,
) -> int:
    """Inside a transaction: the fenced run update (usage, plus ``run_fields``), the steps, the
    checkpoint at the last step's index, and the inputs those steps took. Returns that index.
    ``unless_cancelled``: a requested cancel refuses the write (CancelRequested), atomically."""
    if not _update_held(
        claim,
        unless_cancelled=unless_cancelled,
        input_tokens=F("input_tokens") + usage.input_tokens,
        output_tokens=F("output_tokens") + usage.output_tokens,
        stalled_executions=0,
        updated_at=Now(),
        **run_fields,
    ):
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
    consumed_inputs: Iterable[str] = (),
) -> None:
    """Steps + checkpoint + usage of one model call (or of tools run after a decision), atomically.
    The call itself was counted before it was made (``count_model_call``).
    Raises LeaseLostError, writing nothing, when the claim is no longer held."""
    with transaction.atomic():
        _record(claim, steps, messages, finish_reason, usage, consumed_inputs)
        crash_point("before_step_commit")
    crash_point("after_step_commit")


def arguments_hash(arguments: Any) -> str:
    """What an approval is bound to: the exact arguments of the call, canonically encoded."""
    encoded = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


def open_wait(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    call: CallRef,
    tool_name: str,
    tool_input: Any,
    ttl: timedelta,
    usage: Usage = NO_USAGE,
    consumed_inputs: Iterable[str] = (),
) -> WaitPoint:
    """Record the step that asks for approval, open a WaitPoint, move to ``waiting`` and release the
    claim, atomically. A requested cancel wins: CancelRequested, nothing written. The returned wait
    point carries the raw token in memory only."""
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        wait_index = _record(
            claim,
            steps,
            messages,
            "tool_calls",
            usage,
            consumed_inputs,
            unless_cancelled=True,
            status=Status.WAITING,
            claim_owner=None,
            claim_expires_at=None,
        )
        tool_input = without_nul(tool_input)
        waitpoint = WaitPoint.objects.create(
            run_id=claim.run_id,
            step_index=wait_index,
            model_step=call.model_step,
            call_position=call.position,
            arguments_hash=arguments_hash(tool_input),
            tool_call_id=without_nul(call.call_id),
            tool_name=without_nul(tool_name),
            input=tool_input,
            # The database's clock: hosts' clocks disagree, and expiry is decided in SQL.
            expires_at=_db_now_plus(ttl),
            token_hash=hash_token(token),
        )
    waitpoint.refresh_from_db(fields=["expires_at", "created_at"])
    waitpoint.token = token
    return waitpoint


def back_to_waiting(claim: Claim) -> bool:
    """A claimed run whose checkpoint ends on an undecided approval goes back to waiting. A
    requested cancel wins (CancelRequested). False: the claim was lost."""
    return _update_held(
        claim,
        unless_cancelled=True,
        status=Status.WAITING,
        claim_owner=None,
        claim_expires_at=None,
        stalled_executions=0,
        updated_at=Now(),
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
    A terminal settle answers every open tool call in the checkpoint (with ``close_history``, or a
    generic text), so a thread can always continue. ``interrupted`` is refused with CancelRequested
    when a cancel was requested: the cancel wins. False: the claim was lost and nothing was
    written."""
    fields: dict[str, Any] = {
        "status": status,
        "claim_owner": None,
        "claim_expires_at": None,
        "stalled_executions": 0,
        "updated_at": Now(),
    }
    if status in TERMINAL:
        fields.update(
            output=without_nul(output),
            error_code=error_code,
            error_message=without_nul(error_message),
            finished_at=Now(),
        )
        close_history = close_history or CLOSED_AT_END
    with transaction.atomic():
        if not _update_held(claim, unless_cancelled=status not in TERMINAL, where=_to(status), **fields):
            return False
        if status == Status.CANCELLED:
            # A cancel its execution settles (e.g. while going back to waiting) closes the approval too.
            _cancel_open_approval(claim.run_id)
        if close_history is not None:
            _close_history(claim.run_id, close_history)
    return True


CLOSED_AT_END = "The run ended before this tool call ran."


def _cancel_open_approval(run_id: str, by: Any = None) -> None:
    WaitPoint.objects.filter(run_id=run_id, decision__isnull=True).update(
        decision=WaitPoint.Decision.CANCELLED,
        decided_by=by if getattr(by, "pk", None) else None,
        decided_at=Now(),
        reason="run cancelled",
    )


def _close_history(run_id: str, reason: str) -> None:
    checkpoint = Checkpoint.objects.filter(run_id=run_id).first()
    if checkpoint is not None:
        closed = answer_open_calls(checkpoint.messages, reason)
        if len(closed) != len(checkpoint.messages):
            _write_checkpoint(run_id, checkpoint.step_index, closed, checkpoint.finish_reason)


# --- steering from outside an execution --------------------------------------------------------


def cancel(run_id: str, *, by: Any = None) -> str:
    """Cancel from any process. Returns the status the run has afterwards: ``cancelled`` at once when
    no worker holds it; ``running`` with ``cancel_requested`` set when its owner must abort it; the
    terminal status unchanged when it had already settled. ``by`` is recorded as the one who decided
    the open approval, if any."""
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
            _cancel_open_approval(run_id, by)
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
    ``already_decided``, ``expired``, ``bad_token``).

    Lock order, here as everywhere: the run row, then its wait point (``cancel`` updates the run,
    then closes the wait point), so a concurrent approve and cancel cannot deadlock."""
    run_id = WaitPoint.objects.filter(approval_id=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise DecisionRefused(f"no approval {approval_id}", code="not_found")
    with transaction.atomic():
        waiting = Run.objects.select_for_update().filter(pk=run_id, status=Status.WAITING).exists()
        waitpoint = (
            WaitPoint.objects.select_for_update()
            .filter(approval_id=approval_id)
            .annotate(expired_now=Q(expires_at__lte=Now()))
            .first()
        )
        assert waitpoint is not None  # wait points are deleted only with their run
        if token is not None and not secrets.compare_digest(hash_token(token), waitpoint.token_hash):
            raise DecisionRefused("this token does not decide this approval", code="bad_token")
        if waitpoint.decision is not None:
            code = "expired" if waitpoint.decision == WaitPoint.Decision.EXPIRED else "already_decided"
            raise DecisionRefused(f"approval {approval_id} was already {waitpoint.decision}", code=code)
        if decision != WaitPoint.Decision.EXPIRED and waitpoint.expired_now:
            raise DecisionRefused(f"approval {approval_id} expired at {waitpoint.expires_at}", code="expired")
        if not waiting:
            raise DecisionRefused(f"run {run_id} is not waiting", code="already_decided")
        WaitPoint.objects.filter(pk=waitpoint.pk).update(
            decision=decision,
            decided_by=by if getattr(by, "pk", None) else None,
            decided_at=Now(),
            reason=without_nul(reason),
        )
        if decision != WaitPoint.Decision.APPROVED:
            checkpoint = Checkpoint.objects.get(run_id=run_id)
            verdict = "denied" if decision == WaitPoint.Decision.DENIED else "expired without a decision"
            text = f"The call to {waitpoint.tool_name} was not run: approval {verdict}."
            if reason:
                text += f" Reason: {reason}"
            _write_checkpoint(
                run_id,
                checkpoint.step_index,
                [*checkpoint.messages, tool_result(waitpoint.tool_call_id, text)],
                checkpoint.finish_reason,
            )
        Run.objects.filter(_to(Status.RUNNING), pk=run_id, status=Status.WAITING).update(
            status=Status.RUNNING, updated_at=Now()
        )
        waitpoint.refresh_from_db()
    return waitpoint


def fail_expired_wait(approval_id: str) -> bool:
    """For agents that fail rather than deny on expiry: waiting -> failed (``approval_expired``)."""
    run_id = WaitPoint.objects.filter(approval_id=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return False
    with transaction.atomic():
        # Run first, then wait point: the lock order of decide and cancel.
        updated = Run.objects.filter(_to(Status.FAILED), pk=run_id, status=Status.WAITING).update(
            status=Status.FAILED,
            error_code="approval_expired",
            error_message=f"approval {approval_id} expired",
            finished_at=Now(),
            updated_at=Now(),
        )
        if not updated:
            return False
        if not WaitPoint.objects.filter(
            approval_id=approval_id, decision__isnull=True, expires_at__lte=Now()
        ).update(decision=WaitPoint.Decision.EXPIRED, decided_at=Now()):
            # Decided, or not expired after all (by the database's clock): undo.
            transaction.set_rollback(True)
            return False
        _close_history(run_id, "The call was not run: its approval expired.")
    return True


# --- notifications -----------------------------------------------------------------------------

# A notifier call in flight holds the wait point this long: no one re-sends meanwhile.
NOTIFY_LEASE = timedelta(minutes=5)


def notify_backoff(attempts: int) -> timedelta:
    """Wait before re-sending after ``attempts`` failed notifier calls: 30 s, doubling, at most 1 h."""
    return min(timedelta(seconds=30) * (2 ** max(attempts - 1, 0)), timedelta(hours=1))


def take_notification(waitpoint: WaitPoint) -> bool:
    """Take the right to call the notifier now: the wait point is open, not notified, and no other
    call is in flight or backing off. Two janitors (or an execution and a janitor) never both get
    it. False: leave it alone."""
    due = Q(next_notify_at__isnull=True) | Q(next_notify_at__lte=Now())
    open_ = Q(pk=waitpoint.pk, decision__isnull=True, notified_at__isnull=True)
    return bool(
        WaitPoint.objects.filter(due, open_).update(
            next_notify_at=_db_now_plus(NOTIFY_LEASE), notify_attempts=F("notify_attempts") + 1
        )
    )


def notification_failed(waitpoint: WaitPoint) -> None:
    attempts = WaitPoint.objects.filter(pk=waitpoint.pk).values_list("notify_attempts", flat=True).first()
    WaitPoint.objects.filter(pk=waitpoint.pk, notified_at__isnull=True).update(
        next_notify_at=_db_now_plus(notify_backoff(attempts or 1))
    )


def mark_notified(waitpoint: WaitPoint) -> bool:
    return bool(
        WaitPoint.objects.filter(pk=waitpoint.pk, notified_at__isnull=True).update(
            notified_at=Now(), next_notify_at=None
        )
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
        run_id=claim.run_id,
        key=key,
        tool_name=without_nul(tool_name),
        input=without_nul(tool_input),
        output=without_nul(output),
        error=without_nul(error),
    )
