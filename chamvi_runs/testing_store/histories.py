"""A run's history in memory, stored by parts as ``store.histories`` stores it: the checkpoint's
whole history as of ``whole_step``, and each step's part (its messages, or their count when the
whole history was written with it). Kept that way, not as one list, so that a save whose ``Stored``
does not match what is stored reads back the same wrong history here as on PostgreSQL.

``history_at`` mirrors ``models.Checkpoint.history``; ``move_checkpoint`` and ``append`` mirror the
functions of ``store.histories`` that bear their names."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError

from ..core.messages import history_before
from ..core.storable import storable
from ..core.types import Message
from ..models import Step
from ..store.histories import count


def as_stored(value: Any) -> Any:
    """``value`` as a JSON column gives it back: a fresh copy, tuples made lists, keys made strings.
    The caller may change what it passed; the store's copy stays as written."""
    return json.loads(json.dumps(value))


@dataclass
class CheckpointRow:
    """The fields of ``models.Checkpoint`` a history is read from."""

    step_index: int
    messages: list[Message]
    length: int | None
    finish_reason: str
    created_at: datetime
    whole_step: int | None = None
    whole_length: int | None = None
    opening_length: int | None = None

    def behind(self) -> bool:
        """``Checkpoint._behind``: steps saved after ``whole_step`` add to ``messages``."""
        return (
            self.whole_step is not None
            and self.whole_step < self.step_index
            and self.whole_length == len(self.messages)
        )


def history_at(
    run_id: str, checkpoint: CheckpointRow, steps: Mapping[int, Step], index: int | None = None
) -> list[Message]:
    """``Checkpoint.history``: the history after step ``index`` (the checkpoint's by default; -1:
    before the run's first step). Raises ValueError when it cannot be rebuilt."""
    at = checkpoint.step_index if index is None else index
    if at > checkpoint.step_index:
        raise ValueError(f"run {run_id} has no step {at} in its history")
    full = copy.deepcopy(checkpoint.messages)
    if checkpoint.behind():
        assert checkpoint.whole_step is not None
        since = [
            steps[i].messages for i in sorted(steps) if checkpoint.whole_step < i <= checkpoint.step_index
        ]
        full += [copy.deepcopy(message) for part in since for message in part or ()]
    if at == checkpoint.step_index:
        return full
    upto: list[Any] = [steps[i].messages for i in sorted(steps) if i <= at]
    return history_before(run_id, full, checkpoint.opening_length, upto, at)


def move_checkpoint(
    checkpoints: dict[str, CheckpointRow],
    run_id: str,
    step_index: int,
    messages: list[Message],
    finish_reason: str,
    *,
    now: datetime,
    whole: bool,
    opening_length: int | None = None,
) -> None:
    """``histories.move_checkpoint``: the run's one checkpoint moved forward to ``step_index``. A
    checkpoint past it is left alone, as the update's ``step_index__lte`` filter leaves it; then
    a part-only save is the AssertionError, and a whole one the IntegrityError of a second
    checkpoint (the caller's transaction rolls back)."""
    checkpoint = checkpoints.get(run_id)
    if checkpoint is not None and checkpoint.step_index <= step_index:
        checkpoint.step_index = step_index
        checkpoint.length = len(messages)
        checkpoint.finish_reason = finish_reason
        checkpoint.created_at = now
        if whole:
            checkpoint.messages = as_stored(storable(messages))
            checkpoint.whole_step, checkpoint.whole_length = step_index, len(messages)
        if opening_length is not None:
            checkpoint.opening_length = opening_length
        return
    if not whole:
        raise AssertionError(f"run {run_id}: the first save of a history writes it whole")
    if checkpoint is not None:
        raise IntegrityError(f"run {run_id} has a checkpoint already (one per run)")
    checkpoints[run_id] = CheckpointRow(
        step_index=step_index,
        messages=as_stored(storable(messages)),
        length=len(messages),
        finish_reason=finish_reason,
        created_at=now,
        whole_step=step_index,
        whole_length=len(messages),
        opening_length=opening_length,
    )


def append(
    run_id: str,
    checkpoint: CheckpointRow | None,
    steps: Mapping[int, Step],
    more: Callable[[list[Message]], list[Message]],
) -> None:
    """``histories.append``: messages that join the history at the checkpoint's step without a step
    of their own (none: the history is only made whole), the whole history written."""
    if checkpoint is None:
        return
    current = history_at(run_id, checkpoint, steps)
    messages = as_stored(storable(more(current)))
    if messages:
        step = steps.get(checkpoint.step_index)
        if step is not None and step.messages is not None:
            step.messages = count(step.messages) + len(messages)
    elif not checkpoint.behind():
        return
    full = [*current, *messages]
    checkpoint.messages = full
    checkpoint.whole_step = checkpoint.step_index
    checkpoint.whole_length = checkpoint.length = len(full)
