"""What follows a settle, wherever it happened (an execution, a cancel, an expiry): the final
event, the ``run_settled`` signal, and the doorbell for whoever runs next."""

from __future__ import annotations

from .. import signals, store
from ..core.ports import Broadcaster
from ..core.states import TERMINAL, Status
from ..dispatch.doorbell import enqueue, enqueue_next_in_line
from ..models import Run
from ..streaming.broadcast import ChannelsBroadcaster
from ..streaming.serializers import run_end_event


def announce_settled(
    run_id: str, broadcaster: Broadcaster | None = None, *, waited: bool = True, run: Run | None = None
) -> Run:
    """``waited`` False: the run never had a wait point (it settled in its first execution), so
    its ``run.end`` has no decisions, and the query for them is spared. ``run``: the run as its
    settle left it, when the settle returned it (it is read otherwise)."""
    run = run if run is not None else store.run(run_id)
    broadcaster = broadcaster or broadcaster_for(run)
    if run.status in TERMINAL:
        broadcaster.publish(run.pk, run_end_event(run, waited=waited))
    broadcaster.flush()
    signals.run_settled.send(Run, run=run)
    if run.status == Status.INTERRUPTED:
        # Another worker resumes it from its checkpoint now, not after a lease expiry.
        enqueue(run.pk)
    else:
        enqueue_next_in_line(run)
    if run.parent_id is not None:
        wake_parent(run)
    if run.status == Status.CANCELLED:
        cancel_children(run.pk)
    return run


def broadcaster_for(run: Run) -> ChannelsBroadcaster:
    """Where the run's events go: its groups, and a child run's ancestors' (SPEC §13)."""
    if run.parent_id is None:
        return ChannelsBroadcaster(run.thread, run.scope)
    above, thread, scope = store.ancestors(run)
    return ChannelsBroadcaster(thread, scope, above)


def wake_parent(child: Run) -> None:
    """A settled child decides its parent's wait for it; the last one re-queues the parent. A
    process that dies before this leaves the parent waiting: ``chamvi_tick`` calls it again."""
    parent = store.settle_into_parent(child)
    if parent is not None:
        enqueue(parent)


def cancel_children(run_id: str) -> None:
    """A cancelled run cancels the children it started that are still active, and theirs."""
    for child in store.active_children(run_id):
        if store.cancel(child):
            announce_settled(child)
