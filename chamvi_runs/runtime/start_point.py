"""Where an execution starts: the run's checkpoint; or, its first, the history it opens with (its
thread's latest, or the point it was forked from) and the trigger message."""

from __future__ import annotations

from typing import Any

from ..core.branches import parents
from ..core.messages import answer_open_calls, trigger_message
from ..core.ports import Store
from ..core.records import Opening
from ..core.states import TERMINAL
from ..core.types import Message
from ..errors import HistoryUnavailable
from ..models import Run
from ..policy import policy

FORKED_BEFORE = "This call never ran: the conversation was forked before it."

# How many runs up a thread's branch are looked at for one its creator may view.
HISTORY_CANDIDATES = 50


def start_point(db: Store, run: Run, *, resumed: bool) -> tuple[list[Message], int, Opening | None]:
    """The history to go on from, the index of the next step, and (for a run no step of which is
    saved yet) the opening its first save stores. A run no execution started (``resumed`` False)
    has no checkpoint to read: only an execution's steps, and decisions on the runs they left
    waiting, write one. Raises HistoryUnavailable when the history it was forked from is gone."""
    saved = db.checkpoint(run.pk) if resumed else None
    if saved is not None:
        messages, index = saved
        return messages, index + 1, None
    trigger = run.trigger
    opening = _opening(db, run)
    first = trigger_message(
        trigger.get("source", "api"),
        trigger.get("trigger", "api"),
        trigger.get("payload"),
        trigger.get("attachments"),
    )
    return [*opening.messages, first], 0, opening


def _opening(db: Store, run: Run) -> Opening:
    if run.base_id is not None:
        # A fork, a regenerate or a resend: the point was chosen when the run was created.
        found = db.history(run.base_id, run.base_step)
        if found is None:
            raise HistoryUnavailable(f"the history of run {run.base_id} this run starts from is gone")
        # A fork after a step whose tool calls had not all run yet: the model is told they never will.
        return Opening(answer_open_calls(found[0], FORKED_BEFORE))
    if run.thread:
        return thread_history(db, run)
    return Opening([])


def thread_history(db: Store, run: Run) -> Opening:
    """The history the thread goes on from: its current branch's (``core.branches``), from the
    run's parent up, the first settled run its creator may view (SPEC §3: a run never receives a
    conversation its creator could not read). A regenerate, resend or fork that saved no step (it
    was cancelled before it ran) stands for the history it would have started from."""
    creator = run.created_by
    up = parents(db.thread_nodes(run.thread or "", run.scope))
    at = up.get(run.pk)
    for _ in range(HISTORY_CANDIDATES):
        if at is None:
            break
        earlier = db.run(at)
        if earlier.status in TERMINAL and _may_read(creator, earlier):
            found = db.history(earlier.pk)
            if found is None and earlier.base_id is not None:
                found = db.history(earlier.base_id, earlier.base_step)
            if found is not None:
                return Opening(answer_open_calls(found[0], FORKED_BEFORE))
        at = up.get(at)
    return Opening([])


def _may_read(creator: Any, earlier: Run) -> bool:
    """Code that started a run without a creator continues only runs without one."""
    if creator is None:
        return earlier.created_by_id is None
    return bool(policy().can_view(creator, earlier))
