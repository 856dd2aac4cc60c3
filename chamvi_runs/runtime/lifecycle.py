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
    broadcaster = broadcaster or ChannelsBroadcaster(run.thread, run.scope)
    if run.status in TERMINAL:
        broadcaster.publish(run.pk, run_end_event(run, waited=waited))
    broadcaster.flush()
    signals.run_settled.send(Run, run=run)
    if run.status == Status.INTERRUPTED:
        # Another worker resumes it from its checkpoint now, not after a lease expiry.
        enqueue(run.pk)
    else:
        enqueue_next_in_line(run)
    return run
