"""Writes from outside an execution: cancel, steering input, approval decisions and their expiry.

Lock order, here as everywhere: the run row, then its wait point, so a concurrent approve and
cancel cannot deadlock."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from ..core.decisions import CLOSED_BY
from ..core.messages import tool_result
from ..core.records import hash_token
from ..core.states import TERMINAL, Status
from ..core.storable import storable
from ..errors import DecisionRefused, RunNotFound
from ..models import Checkpoint, Run, RunInput, WaitPoint
from .fence import to
from .progress import cancel_open_approval, close_history_of, write_checkpoint


def cancel(run_id: str, *, by: Any = None) -> bool:
    """Cancel from any process. True: this call settled the run ``cancelled`` (no worker held it),
    and its caller announces the settle. False: a worker holds it and now aborts it within about a
    second (``cancel_requested`` is set), or it had already settled. Raises RunNotFound. ``by`` is
    recorded as the one who decided the open approval, if any."""
    with transaction.atomic():
        unheld = Q(claim_owner__isnull=True) | Q(claim_expires_at__lt=Now())
        if Run.objects.filter(to(Status.CANCELLED), unheld, pk=run_id).update(
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


def add_input(run_id: str, payload: Any) -> RunInput:
    """Queue ``payload`` for the run's next model call. Raises RunNotFound, or DecisionRefused
    (``run_settled``) when the run takes no more input."""
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
