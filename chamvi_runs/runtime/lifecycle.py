"""What follows a settle, wherever it happened (an execution, a cancel, an expiry): the final
event, the ``run_settled`` signal, and the doorbell for whoever runs next."""

from __future__ import annotations

from .. import signals, store
from ..core.ports import Broadcaster, Store
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
        enqueue(run.pk, (run.agent, run.agent_version))
    else:
        enqueue_next_in_line(run)
    if run.parent_id is not None:
        wake_parent(run)
    if run.status == Status.CANCELLED:
        cancel_children(run.pk)
    return run


def route(run: Run, db: Store = store) -> tuple[str | None, str, list[str]]:
    """Where the run's events go besides its own group: the thread (and its scope) and the runs
    above it. A child run's (SPEC §13) go to its ancestors and its topmost ancestor's thread."""
    if run.parent_id is None:
        return run.thread, run.scope, []
    above, thread, scope = db.ancestors(run)
    return thread, scope, above


def broadcaster_for(run: Run) -> ChannelsBroadcaster:
    return ChannelsBroadcaster(*route(run))


def wake_parent(child: Run) -> bool:
    """A settled child decides its parent's wait for it; the last one re-queues the parent (True).
    A process that dies before this leaves the parent waiting: ``chamvi_tick`` calls it again."""
    parent = store.settle_into_parent(child)
    if parent is not None:
        enqueue(parent)
    return parent is not None


def cancel_children(run_id: str) -> None:
    """A cancelled run cancels the children it started that are still active, and theirs."""
    for child in store.active_children(run_id):
        cancel_now(child)


def cancel_now(run_id: str) -> bool:
    """Cancel a run no worker holds, and announce it (its own children follow); False when a worker
    holds it (it aborts within a second) or it had settled."""
    if not store.cancel(run_id):
        return False
    announce_settled(run_id)
    return True
