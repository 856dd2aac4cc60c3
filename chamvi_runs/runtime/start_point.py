"""Where an execution starts: the run's checkpoint, or (its first) the thread's history and the
trigger message."""

from __future__ import annotations

from ..core.messages import trigger_message
from ..core.ports import Store
from ..core.types import Message
from ..models import Run
from ..policy import policy

# How many settled runs of a thread are looked at, newest first, for one its creator may view.
HISTORY_CANDIDATES = 50


def start_point(db: Store, run: Run, *, resumed: bool) -> tuple[list[Message], int]:
    """The history to go on from, and the index of the next step. A run no execution started
    (``resumed`` False) has no checkpoint to read: only an execution's steps, and decisions on the
    runs they left waiting, write one."""
    saved = db.checkpoint(run.pk) if resumed else None
    if saved is not None:
        messages, index = saved
        return messages, index + 1
    trigger = run.trigger
    history = thread_history(db, run) if run.thread else []
    first = trigger_message(
        trigger.get("source", "api"),
        trigger.get("trigger", "api"),
        trigger.get("payload"),
        trigger.get("attachments"),
    )
    return [*history, first], 0


def thread_history(db: Store, run: Run) -> list[Message]:
    """The latest settled history of the thread that this run's creator may view: a run never
    receives a conversation its creator could not read (SPEC §3)."""
    creator = run.created_by
    for earlier, messages in db.earlier_thread_histories(run, HISTORY_CANDIDATES):
        if creator is None or policy().can_view(creator, earlier):
            return messages
    return []
