"""A run's history, stored by parts (SPEC §4, §12): a save moves the checkpoint's index and length
forward, and each step stores the messages it added (``Step.messages``). The whole history
(``Checkpoint.messages``) is written too while it is short (``WHOLE_UNTIL`` messages), by the first
save of each execution, and whenever the run leaves its worker (a wait, a settle): what a process
of the previous release reads. A save that writes it leaves its steps the count of their messages
only (the whole history holds them). Past that, a step's cost does not grow with the history.
``Checkpoint.history()`` is the whole history at any time, and ``history(index)`` the history
after any step: how a fork, a regenerate or a resend starts from an earlier point.

Every write here runs inside a transaction that holds the run's row (see ``fence``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.utils import timezone

from ..core.records import StepRecord
from ..core.storable import storable
from ..core.types import Message
from ..errors import HistoryUnavailable
from ..models import Checkpoint, Step
from . import step_sql

# Up to this many messages, a history is short: written whole at every save, it is one row of a few
# KB, and ``Checkpoint.messages`` is always current (past it, only when no execution is under way).
WHOLE_UNTIL = 40


def parts(steps: Sequence[StepRecord], added: list[Message]) -> list[list[Message]]:
    """Which of the steps added which of ``added`` (the messages after the stored history): a model
    call's step takes what came before its answer (a run's trigger message, steering inputs) and
    the answer; a tool step its result; a wait step nothing yet (its decision adds the result
    later). What is left, results written for calls that never ran, goes with the last step."""
    out: list[list[Message]] = []
    at = 0
    for step in steps:
        if step.kind == "llm":
            end = next((n + 1 for n in range(at, len(added)) if added[n].get("role") == "assistant"), at)
        elif step.kind == "tool":
            end = min(at + 1, len(added))
        else:
            end = at
        out.append(added[at:end])
        at = end
    if out:
        out[-1] = [*out[-1], *added[at:]]
    return out


def writes_whole(messages: list[Message], asked: bool) -> bool:
    """Whether a save writes the whole history: when asked (an execution's first save, a wait, a
    settle), or while it is short."""
    return asked or len(messages) <= WHOLE_UNTIL


def stored_parts(parts: list[list[Message]], whole: bool) -> list[list[Message] | int]:
    """What the steps of a save store of their parts: the messages, or only how many when the save
    writes the whole history, which holds them (``Checkpoint.history`` needs the counts only)."""
    return [len(part) for part in parts] if whole else list(parts)


def move_checkpoint(
    run_id: str,
    step_index: int,
    messages: list[Message],
    finish_reason: str,
    *,
    whole: bool,
    opening_length: int | None = None,
) -> None:
    """The one checkpoint of the run, moved forward to ``step_index``: its length, and with
    ``whole`` the whole history (``messages``, stored). ``opening_length``: how many of the
    messages came before the run's first step (its first save says it)."""
    fields: dict[str, object] = {
        "step_index": step_index,
        "length": len(messages),
        "finish_reason": finish_reason,
        # auto_now is not applied by update(): the checkpoint says when it last moved.
        "created_at": timezone.now(),
    }
    if whole:
        fields.update(messages=storable(messages), whole_step=step_index, whole_length=len(messages))
    if opening_length is not None:
        fields["opening_length"] = opening_length
    if step_sql.applies() and opening_length is not None and whole:
        # The run's first save: no checkpoint yet, so the insert (not an update that finds none).
        step_sql.create_checkpoint(run_id, step_index, fields)
        return
    if step_sql.applies():
        if step_sql.move_checkpoint(run_id, step_index, fields):
            return
    elif Checkpoint.objects.filter(run_id=run_id, step_index__lte=step_index).update(**fields):
        return
    if not whole:
        raise AssertionError(f"run {run_id}: the first save of a history writes it whole")
    Checkpoint.objects.create(run_id=run_id, **fields)


def append(run_id: str, more: Callable[[list[Message]], list[Message]]) -> None:
    """Messages that join the history at the checkpoint's step, without a step of their own:
    ``more(history)`` says which (the result a denial or an expiry gives a call, the results of
    calls closed when the run ends; none: the history is only made whole). The run is not with a
    worker: the whole history is written, the history read once."""
    checkpoint = Checkpoint.objects.filter(run_id=run_id).first()
    if checkpoint is None:
        return
    current = checkpoint.history()
    messages = storable(more(current))
    if messages:
        step = Step.objects.filter(run_id=run_id, index=checkpoint.step_index).only("messages").first()
        if step is not None and step.messages is not None:
            # The whole history is written below: the step keeps the count of its messages only.
            Step.objects.filter(pk=step.pk).update(messages=count(step.messages) + len(messages))
    elif not checkpoint._behind():
        return  # written whole at its step already
    full = [*current, *messages]
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        messages=full, whole_step=checkpoint.step_index, whole_length=len(full), length=len(full)
    )


def count(part: list[Message] | int) -> int:
    """How many messages a step added: its part, or its count."""
    return part if isinstance(part, int) else len(part)


def history(run_id: str, index: int | None = None) -> tuple[list[Message], int] | None:
    """The history after step ``index`` (the checkpoint's by default; -1: the history before the
    run's first step) and that index. None: the run has no checkpoint (no step saved yet). Raises
    HistoryUnavailable for a step the run does not have, or one a release that stored histories
    whole wrote."""
    checkpoint = Checkpoint.objects.filter(run_id=run_id).first()
    if checkpoint is None:
        return None
    at = checkpoint.step_index if index is None else index
    try:
        return checkpoint.history(at), at
    except ValueError as exc:
        raise HistoryUnavailable(str(exc)) from None
