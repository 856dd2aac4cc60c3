"""Writes from outside an execution: cancel, steering input, approval decisions and their expiry.

Lock order, here as everywhere: the run row, then its wait point, so a concurrent approve and
cancel cannot deadlock."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction
from django.db.models import Count, Q, Sum, TextField
from django.db.models.functions import Cast, Coalesce, Length, Now

from ..core.decisions import CLOSED_BY
from ..core.messages import tool_result
from ..core.records import hash_token
from ..core.states import TERMINAL, Status
from ..core.storable import storable
from ..errors import DecisionRefused, InputRefused, RunNotFound
from ..models import Checkpoint, Run, RunInput, WaitPoint
from .fence import effect_lock, to
from .progress import cancel_open_approval, close_history_of, write_checkpoint


def cancel(run_id: str, *, by: Any = None) -> bool:
    """Cancel from any process, never waiting for an effect tool. True: this call settled the run
    ``cancelled`` (no worker held it), and its caller announces the settle. False: a worker holds
    it (a live lease, or an effect tool in flight) and now aborts it within about a second
    (``cancel_requested`` is set), or it had already settled. Raises RunNotFound. ``by`` is
    recorded as the one who decided the open approval, if any."""
    with transaction.atomic():
        at_once = to(Status.CANCELLED) & (Q(claim_owner__isnull=True) | Q(claim_expires_at__lt=Now()))
        # An effect tool in flight holds a running run as a live lease does, even past its lease:
        # its execution settles the cancel once the effect has committed. Tried, never waited for.
        if not effect_lock(run_id, wait=False):
            at_once &= ~Q(status=Status.RUNNING)
        if Run.objects.filter(at_once, pk=run_id).update(
            status=Status.CANCELLED,
            cancel_requested=True,
            claim_owner=None,
            claim_expires_at=None,
            finished_at=Now(),
            updated_at=Now(),
        ):
            cancel_open_approval(run_id, by)
            close_history_of(run_id, CLOSED_BY["cancel"])
            return True
        if Run.objects.filter(pk=run_id, status=Status.RUNNING).update(
            cancel_requested=True, updated_at=Now()
        ):
            return False
    if not Run.objects.filter(pk=run_id).exists():
        raise RunNotFound(run_id)
    return False


# An input stored by a release that did not record its size is measured by its stored text.
_SIZE = Coalesce("size", Length(Cast("payload", TextField())))


def add_input(run_id: str, payload: Any, *, size: int, max_inputs: int, max_pending_bytes: int) -> RunInput:
    """Queue ``payload`` (``size`` bytes as JSON) for the run's next model call. Raises RunNotFound;
    DecisionRefused (``run_settled``) when the run takes no more input; InputRefused
    (``too_many_inputs``) when the run has ``max_inputs`` already, or (``inputs_pending``) when the
    inputs no model call has taken yet would pass ``max_pending_bytes`` with this one. A refused
    input is not stored."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).only("status").first()
        if run is None:
            raise RunNotFound(run_id)
        if run.status in TERMINAL:
            raise DecisionRefused(f"run {run_id} is {run.status}; it takes no more input", code="run_settled")
        # Counted under the run row's lock: of two inputs racing for the last slot, the second
        # counts the first.
        taken = RunInput.objects.filter(run_id=run_id).aggregate(
            inputs=Count("pk"), pending=Sum(_SIZE, filter=Q(consumed_step__isnull=True), default=0)
        )
        if taken["inputs"] >= max_inputs:
            raise InputRefused(
                f"run {run_id} has taken {taken['inputs']} inputs, as many as MAX_INPUTS "
                f"({max_inputs}) allows",
                code="too_many_inputs",
            )
        if taken["pending"] + size > max_pending_bytes:
            raise InputRefused(
                f"run {run_id} holds {taken['pending']} bytes of input its next model call has not taken "
                f"yet; {size} more would pass MAX_PENDING_INPUT_BYTES ({max_pending_bytes}): send it "
                "once that call has taken them",
                code="inputs_pending",
            )
        return RunInput.objects.create(run_id=run_id, payload=payload, size=size)


def decide(
    approval_id: str, decision: str, *, by: Any = None, reason: str = "", token: str | None = None
) -> WaitPoint:
    """Record an approval decision once, and return the decided wait point. Approved: the run goes
    back to ``running`` (unclaimed) and its next execution runs the tool. Denied or expired: the
    tool's result in the checkpoint (same step index, replacing it) tells the model so. Raises
    DecisionRefused (``not_found``, ``already_decided``, ``expired``, ``bad_token``): a refusal the
    caller shows, with its reason."""
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
            reason=storable(reason),
        )
        if decision != WaitPoint.Decision.APPROVED:
            checkpoint = Checkpoint.objects.get(run_id=run_id)
            verdict = "denied" if decision == WaitPoint.Decision.DENIED else "expired without a decision"
            text = f"The call to {waitpoint.tool_name} was not run: approval {verdict}."
            if reason:
                text += f" Reason: {reason}"
            write_checkpoint(
                run_id,
                checkpoint.step_index,
                [*checkpoint.messages, tool_result(waitpoint.tool_call_id, text)],
                checkpoint.finish_reason,
            )
        Run.objects.filter(to(Status.RUNNING), pk=run_id, status=Status.WAITING).update(
            status=Status.RUNNING, updated_at=Now()
        )
        waitpoint.refresh_from_db()
    return waitpoint


def fail_expired_wait(approval_id: str) -> bool:
    """For agents that fail rather than deny on expiry: waiting -> failed (``approval_expired``).
    False: decided meanwhile, not expired by the database's clock, or not waiting; nothing written."""
    run_id = WaitPoint.objects.filter(approval_id=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return False
    with transaction.atomic():
        updated = Run.objects.filter(to(Status.FAILED), pk=run_id, status=Status.WAITING).update(
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
            transaction.set_rollback(True)
            return False
        close_history_of(run_id, "The call was not run: its approval expired.")
    return True
