"""What an execution writes as it goes: steps with their checkpoint, a wait for approval, the way
back to waiting, and its settle. Each is fenced on the claim; each says whether it applied."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from ..core.faults import crash_point
from ..core.messages import answer_open_calls
from ..core.records import Claim, StepRecord, Stored, WaitRequest, arguments_hash, hash_token
from ..core.states import TERMINAL, Status
from ..core.storable import storable
from ..core.types import NO_USAGE, Message, Usage
from ..models import Checkpoint, Run, RunInput, Step, WaitPoint
from . import histories, step_sql
from .children import start_children
from .fence import db_now_plus, to, update_held
from .queries import pending_inputs, waiting_inputs

CLOSED_AT_END = "The run ended before this tool call ran."


class _Refused(Exception):
    """Rolls back a step's transaction whose fenced write, or step insert, was refused."""


def _write_steps(claim: Claim, steps: Iterable[StepRecord], added: list[list[Message] | int]) -> None:
    now = timezone.now()
    rows = [
        {
            "run_id": claim.run_id,
            "index": s.index,
            "kind": s.kind,
            "name": storable(s.name),
            "input": storable(s.input),
            "output": storable(s.output),
            "error": storable(s.error),
            "messages": storable(messages),
            "attempt": claim.attempt,
            "started_at": s.started_at or now,
            "finished_at": s.finished_at or now,
        }
        for s, messages in zip(steps, added, strict=True)
    ]
    try:
        if step_sql.applies():
            step_sql.insert_steps(rows)
        else:
            Step.objects.bulk_create([Step(**row) for row in rows])
    except IntegrityError:
        # A step index is recorded once; a duplicate means another execution got there first.
        raise _Refused from None


def _record(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    finish_reason: str,
    usage: Usage,
    consumed_inputs: Iterable[str],
    *,
    stored: Stored | None = None,
    whole: bool = False,
    unless_cancelled: bool = False,
    count_call: bool = False,
    **run_fields: Any,
) -> list[RunInput]:
    """Inside a transaction: the fenced run update (usage, plus ``run_fields``), the steps with the
    messages each added to the history, the checkpoint at the last step's index (with the whole
    history when ``whole`` or ``stored`` asks for it), and the inputs those steps took. ``stored``
    None: the caller does not say what is stored, and the whole history is written. With
    ``count_call``, the model call made next is counted, and the inputs waiting for it are
    returned. Raises _Refused when the fence (or, with ``unless_cancelled``, a requested cancel)
    refuses."""
    taken = set(consumed_inputs)
    waiting: list[RunInput] = []
    if count_call and step_sql.applies():
        counted = step_sql.add_usage_and_count(claim, usage)
        held = counted is not None
        waiting = [item for item in counted or () if item.pk not in taken]
    elif not run_fields and step_sql.applies():
        held = step_sql.add_usage(claim, usage, unless_cancelled=unless_cancelled)
    else:
        if count_call:
            run_fields["model_calls"] = F("model_calls") + 1
        held = update_held(
            claim,
            unless_cancelled=unless_cancelled,
            input_tokens=F("input_tokens") + usage.input_tokens,
            output_tokens=F("output_tokens") + usage.output_tokens,
            stalled_executions=0,
            updated_at=Now(),
            **run_fields,
        )
        if held and count_call:
            waiting = [item for item in pending_inputs(claim.run_id) if item.pk not in taken]
    if not held:
        raise _Refused
    if stored is None:
        length = Checkpoint.objects.filter(run_id=claim.run_id).values_list("length", flat=True).first()
        stored = Stored(length or 0, whole=True)
    # What the steps added is written, and the whole history only when asked for or short.
    whole = histories.writes_whole(messages, whole or stored.whole)
    parts = histories.parts(steps, messages[stored.length :])
    _write_steps(claim, steps, histories.stored_parts(parts, whole))
    histories.move_checkpoint(
        claim.run_id,
        max(s.index for s in steps),
        messages,
        finish_reason,
        whole=whole,
        opening_length=stored.opening_length,
    )
    if taken:
        waiting_inputs(claim.run_id).filter(pk__in=taken).update(consumed_step=min(s.index for s in steps))
    return waiting


def record_listings(claim: Claim, listed: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
    """Add the toolset listings an execution made to those its run ``recorded`` (as the execution
    read them: no one else writes them while it holds the claim). False: the claim is lost."""
    return update_held(claim, listed_tools={**(recorded or {}), **storable(listed)})


def save_step(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    finish_reason: str = "",
    usage: Usage = NO_USAGE,
    consumed_inputs: Iterable[str] = (),
    stored: Stored | None = None,
) -> bool:
    """Steps + checkpoint + usage of one model call (or of tools run after a decision), atomically.
    The call itself was counted before it was made (``count_model_call``). False: the claim is lost
    (or another execution recorded these steps first), and nothing was written."""
    saved = _save(claim, steps, messages, finish_reason, usage, consumed_inputs, stored, count_call=False)
    return saved is not None


def save_step_and_count(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    finish_reason: str = "",
    usage: Usage = NO_USAGE,
    consumed_inputs: Iterable[str] = (),
    stored: Stored | None = None,
) -> list[RunInput] | None:
    """``save_step`` of steps after which the execution makes its next model call at once: that
    call is counted in the same transaction (not in a statement and a commit of its own), and the
    steering inputs waiting for it are returned, oldest first. None: the claim is lost, and
    nothing was written. An execution that ends without making the counted call takes it back
    with its settle (``settle(uncount_call=True)``)."""
    return _save(claim, steps, messages, finish_reason, usage, consumed_inputs, stored, count_call=True)


def _save(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    finish_reason: str,
    usage: Usage,
    consumed_inputs: Iterable[str],
    stored: Stored | None,
    *,
    count_call: bool,
) -> list[RunInput] | None:
    """The transaction of both saves: the inputs waiting for the counted call (none counted: an
    empty list), or None when the claim is lost."""
    try:
        with transaction.atomic():
            waiting = _record(
                claim,
                steps,
                messages,
                finish_reason,
                usage,
                consumed_inputs,
                stored=stored,
                count_call=count_call,
            )
            crash_point("before_step_commit")
    except _Refused:
        return None
    crash_point("after_step_commit")
    return waiting


def open_wait(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    waits: list[WaitRequest],
    usage: Usage = NO_USAGE,
    consumed_inputs: Iterable[str] = (),
    stored: Stored | None = None,
) -> list[WaitPoint] | None:
    """Record the steps that ask (an approval, or questions of one model call: their wait steps are
    among ``steps``), open a WaitPoint for each of ``waits`` (with its child run, for a
    delegation: ``children.start_children``), move to ``waiting`` and release the claim,
    atomically. None: a cancel was requested (it wins over the wait) or the claim is lost;
    nothing was written. The returned wait points carry their raw token in memory only."""
    tokens = [secrets.token_urlsafe(32) for _ in waits]
    try:
        with transaction.atomic():
            _record(
                claim,
                steps,
                messages,
                "tool_calls",
                usage,
                consumed_inputs,
                stored=stored,
                whole=True,
                unless_cancelled=True,
                status=Status.WAITING,
                claim_owner=None,
                claim_expires_at=None,
            )
            children = start_children(claim, waits)
            created = []
            for wait, token in zip(waits, tokens, strict=True):
                tool_input = storable(wait.input)
                created.append(
                    WaitPoint.objects.create(
                        run_id=claim.run_id,
                        kind=wait.kind,
                        step_index=wait.step_index,
                        model_step=wait.call.model_step,
                        call_position=wait.call.position,
                        arguments_hash=arguments_hash(tool_input),
                        tool_call_id=storable(wait.call.call_id),
                        tool_name=storable(wait.tool_name),
                        input=tool_input,
                        editable=wait.editable,
                        answer_schema=wait.answer_schema,
                        client=wait.client,
                        child=children.get(wait.call.position),
                        # The database's clock: hosts' clocks disagree, and expiry is decided in SQL.
                        # A child's wait ends when the child settles: it has no expiry of its own.
                        expires_at=None if wait.kind == WaitPoint.Kind.CHILD else db_now_plus(wait.ttl),
                        token_hash=hash_token(token),
                    )
                )
            crash_point("before_step_commit")
    except _Refused:
        return None
    crash_point("after_step_commit")
    for waitpoint, token in zip(created, tokens, strict=True):
        if waitpoint.kind != WaitPoint.Kind.CHILD:
            # Its expiry was computed by the database.
            waitpoint.refresh_from_db(fields=["expires_at", "created_at"])
        waitpoint.token = token
    return created


def back_to_waiting(claim: Claim) -> bool:
    """A claimed run whose checkpoint ends on an undecided approval goes back to waiting. False: a
    cancel was requested (it wins), or the claim is lost; nothing was written."""
    return update_held(
        claim,
        unless_cancelled=True,
        status=Status.WAITING,
        claim_owner=None,
        claim_expires_at=None,
        stalled_executions=0,
        updated_at=Now(),
    )


def save_and_settle(
    claim: Claim,
    steps: list[StepRecord],
    messages: list[Message],
    *,
    finish_reason: str,
    usage: Usage,
    consumed_inputs: Iterable[str],
    status: Status,
    output: Any = None,
    error_code: str = "",
    error_message: str = "",
    unless_input: bool = False,
    stored: Stored | None = None,
) -> Run | bool | None:
    """The step that ends a run (a final answer, a broken model turn) and its terminal settle, in
    one transaction. With ``unless_input``, input that arrived while the model answered (not among
    ``consumed_inputs``) keeps the run going: the step is saved and the run is not settled.
    The settled run (on PostgreSQL with its receipt of inputs as ``receipt``): saved and settled.
    False: saved, not settled (the run goes on). None: the claim is lost, and nothing was
    written."""
    assert status in TERMINAL
    consumed = list(consumed_inputs)
    try:
        with transaction.atomic():
            closed = answer_open_calls(messages, CLOSED_AT_END)
            _record(claim, steps, closed, finish_reason, usage, consumed, stored=stored, whole=True)
            # The run row is locked now and add_input locks it too: an input that is not seen here
            # is refused, once this commits, as one sent to a settled run.
            if step_sql.applies():
                settled: Run | bool = (
                    step_sql.settle_with_answer(
                        claim,
                        status,
                        storable(output),
                        error_code,
                        storable(error_message),
                        unless_input=unless_input,
                    )
                    or False
                )
                if settled:
                    crash_point("before_settle")
            elif unless_input and waiting_inputs(claim.run_id).exclude(pk__in=consumed).exists():
                settled = False
            else:
                crash_point("before_settle")
                update_held(claim, **_settled_fields(status, output, error_code, error_message))
                settled = Run.objects.get(pk=claim.run_id)
            crash_point("before_step_commit")
    except _Refused:
        return None
    crash_point("after_step_commit")
    return settled


def _settled_fields(status: Status, output: Any, error_code: str, error_message: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "status": status,
        "claim_owner": None,
        "claim_expires_at": None,
        "stalled_executions": 0,
        "updated_at": Now(),
    }
    if status in TERMINAL:
        fields.update(
            output=storable(output),
            error_code=error_code,
            error_message=storable(error_message),
            finished_at=Now(),
        )
    return fields


def settle(
    claim: Claim,
    status: Status,
    *,
    output: Any = None,
    error_code: str = "",
    error_message: str = "",
    close_history: str | None = None,
    uncount_call: bool = False,
) -> bool:
    """Final write of an execution: a terminal status, or ``interrupted``. Releases the claim.
    A terminal settle answers every open tool call in the checkpoint (with ``close_history``, or a
    generic text), so a thread can always continue. ``uncount_call``: the execution's last save
    counted a model call it ends without making (``save_step_and_count``), which is taken back.
    False, nothing written: the claim is lost, or (``interrupted`` only) a cancel was requested,
    which wins."""
    fields = _settled_fields(status, output, error_code, error_message)
    if uncount_call:
        fields["model_calls"] = F("model_calls") - 1
    if status in TERMINAL:
        close_history = close_history or CLOSED_AT_END
    with transaction.atomic():
        if not update_held(claim, unless_cancelled=status not in TERMINAL, where=to(status), **fields):
            return False
        if status == Status.CANCELLED:
            # A cancel its execution settles (e.g. while going back to waiting) closes the approval too.
            cancel_open_approval(claim.run_id)
        # The run leaves its worker: its whole history is written, closed or not.
        close_history_of(claim.run_id, close_history)
    return True


def cancel_open_approval(run_id: str, by: Any = None) -> None:
    """Inside the transaction that cancels the run: its open wait points are decided ``cancelled``."""
    WaitPoint.objects.filter(run_id=run_id, decision__isnull=True).update(
        decision=WaitPoint.Decision.CANCELLED,
        decided_by=by if getattr(by, "pk", None) else None,
        decided_at=Now(),
        reason="run cancelled",
    )


def close_history_of(run_id: str, reason: str | None) -> None:
    """Inside the settling transaction: every open tool call of the history gets ``reason`` (None:
    they stay open, for the run to go on), and the whole history is written."""
    if reason is None:
        histories.append(run_id, lambda _history: [])
    else:
        histories.append(run_id, lambda history: answer_open_calls(history, reason)[len(history) :])
