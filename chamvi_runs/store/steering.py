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
from ..core.records import arguments_hash, hash_token
from ..core.states import TERMINAL, Status
from ..core.storable import storable
from ..errors import DecisionRefused, InputRefused, InvalidAnswer, RunNotFound
from ..models import Run, RunInput, WaitPoint
from . import histories
from .fence import effect_lock, free, to
from .progress import cancel_open_approval, close_history_of


def cancel(run_id: str, *, by: Any = None) -> bool:
    """Cancel from any process, never waiting for an effect tool. True: this call settled the run
    ``cancelled`` (no worker held it), and its caller announces the settle. False: a worker holds
    it (a live lease, or an effect tool in flight) and now aborts it within about a second
    (``cancel_requested`` is set), or it had already settled. Raises RunNotFound. ``by`` is
    recorded as the one who decided the open approval, if any."""
    with transaction.atomic():
        at_once = to(Status.CANCELLED) & free()
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


# What each decision may decide: an approval is approved or denied, a question answered; both
# expire, and a cancel closes both.
_DECIDES = {
    WaitPoint.Decision.APPROVED: WaitPoint.Kind.APPROVAL,
    WaitPoint.Decision.DENIED: WaitPoint.Kind.APPROVAL,
    WaitPoint.Decision.ANSWERED: WaitPoint.Kind.INPUT,
}


def decide(
    approval_id: str,
    decision: str,
    *,
    by: Any = None,
    reason: str = "",
    token: str | None = None,
    answer: Any = None,
    approved_input: Any = None,
) -> WaitPoint:
    """Record a decision once, and return the decided wait point. An approval is approved (with
    ``approved_input``, the arguments that run instead of the proposal, already validated: the
    arguments hash binds them) or denied; a question is ``answered`` (``answer``, validated). Once
    none of the run's wait points is open, the run goes back to ``running`` (unclaimed), and
    ``resumes`` on the returned wait point says so: its next execution carries the decisions out.
    A denied or expired approval is answered in the checkpoint at once (same step index, replacing
    it) for the model. Raises DecisionRefused (``not_found``, ``already_decided``, ``expired``,
    ``bad_token``, ``wrong_kind``) or InvalidAnswer (``not_editable``): nothing was written."""
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
        _check_kind(waitpoint, decision, approved_input)
        if waitpoint.decision is not None:
            code = "expired" if waitpoint.decision == WaitPoint.Decision.EXPIRED else "already_decided"
            raise DecisionRefused(f"approval {approval_id} was already {waitpoint.decision}", code=code)
        if decision != WaitPoint.Decision.EXPIRED and waitpoint.expired_now:
            raise DecisionRefused(f"approval {approval_id} expired at {waitpoint.expires_at}", code="expired")
        if not waiting:
            raise DecisionRefused(f"run {run_id} is not waiting", code="already_decided")
        fields: dict[str, Any] = {}
        if approved_input is not None:
            fields.update(
                approved_input=storable(approved_input), arguments_hash=arguments_hash(approved_input)
            )
        if decision == WaitPoint.Decision.ANSWERED:
            fields["answer"] = storable(answer)
        WaitPoint.objects.filter(pk=waitpoint.pk).update(
            decision=decision,
            decided_by=by if getattr(by, "pk", None) else None,
            decided_at=Now(),
            reason=storable(reason),
            **fields,
        )
        if waitpoint.kind == WaitPoint.Kind.APPROVAL and decision != WaitPoint.Decision.APPROVED:
            _answer_refused_call(run_id, waitpoint, decision, reason)
        # Questions of one model call are answered in any order; the run resumes with the last.
        resumes = not WaitPoint.objects.filter(run_id=run_id, decision__isnull=True).exists()
        if resumes:
            Run.objects.filter(to(Status.RUNNING), pk=run_id, status=Status.WAITING).update(
                status=Status.RUNNING, updated_at=Now()
            )
        waitpoint.refresh_from_db()
    waitpoint.resumes = resumes
    return waitpoint


def _check_kind(waitpoint: WaitPoint, decision: str, approved_input: Any) -> None:
    if waitpoint.kind == WaitPoint.Kind.CHILD:
        raise DecisionRefused(
            f"{waitpoint.approval_id} waits for a child run, which decides it when it settles",
            code="wrong_kind",
        )
    kind = _DECIDES.get(WaitPoint.Decision(decision))
    if kind is not None and kind != waitpoint.kind:
        what = (
            "a question is answered" if waitpoint.kind == WaitPoint.Kind.INPUT else "an approval is decided"
        )
        raise DecisionRefused(
            f"{waitpoint.approval_id} is {'a question' if kind == WaitPoint.Kind.APPROVAL else 'an approval'}"
            f": {what}, not {decision}",
            code="wrong_kind",
        )
    if approved_input is not None and not waitpoint.editable:
        raise InvalidAnswer(
            f"the arguments of {waitpoint.tool_name} cannot be changed before approving", code="not_editable"
        )


def _answer_refused_call(run_id: str, waitpoint: WaitPoint, decision: str, reason: str) -> None:
    verdict = "denied" if decision == WaitPoint.Decision.DENIED else "expired without a decision"
    text = f"The call to {waitpoint.tool_name} was not run: approval {verdict}."
    if reason:
        text += f" Reason: {reason}"
    histories.append(run_id, lambda _history: [tool_result(waitpoint.tool_call_id, text)])


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
