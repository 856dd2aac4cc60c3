"""The lease keeper: one thread per process that renews the leases of every execution the process
runs, polls for their cancellation and watches their deadlines, setting an execution's abort
signal when any of them says stop. When to do what is ``core.lease.LeaseClock``'s arithmetic.

One thread and one connection serve all executions: a worker executing ``CONCURRENCY`` runs sends
one cancel read per poll and one renewal statement per heartbeat for all of them, not one of each
per run (and one connection, not one more per run). So no statement of the keeper may wait on a
lock an execution holds, or one execution would stall the leases of all the others: cancels are
read without a lock, a renewal passes over the rows another transaction holds for a moment
(``store.renew_many``), and an effect tool locks no run row while it runs
(``store.lock_for_effect``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.db import connection

from ..conf import conf
from ..core import log_context
from ..core.lease import LeaseClock
from ..core.ports import Store
from ..core.records import Claim
from ..core.types import AbortSignal

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Lease:
    """One execution's claim, as the keeper keeps it. ``stop`` when the execution ends."""

    claim: Claim
    abort: AbortSignal
    clock: LeaseClock
    keeper: LeaseKeeper

    def stop(self) -> None:
        self.keeper.release(self)


class LeaseKeeper:
    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def keep(self, claim: Claim, abort: AbortSignal, deadline: float | None, db: Store) -> Lease:
        lease = Lease(
            claim,
            abort,
            LeaseClock(
                lease=conf.LEASE_SECONDS,
                heartbeat=conf.HEARTBEAT_SECONDS,
                cancel_poll=conf.CANCEL_POLL_SECONDS,
                deadline=deadline,
                renewed_at=time.monotonic(),
            ),
            self,
        )
        with self._changed:
            self._db = db
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="chamvi-leases", daemon=True)
                self._thread.start()
            self._changed.notify()
        return lease

    def release(self, lease: Lease) -> None:
        with self._changed:
            self._leases.discard(lease)
            if not self._leases:
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._leases:
                    # An idle process holds no connection for its keeper (it is opened again at
                    # most once per busy period: a run shorter than a poll never needs one).
                    connection.close()
                while not self._leases:
                    self._changed.wait()
                poll = min(lease.clock.poll for lease in self._leases)
                # Woken early only when the last execution ends, to give its connection back.
                self._changed.wait_for(lambda: not self._leases, poll)
                leases = list(self._leases)
            if leases:
                self._tend(leases)

    def _tend(self, leases: list[Lease]) -> None:
        now = time.monotonic()
        for lease in leases:
            if lease.clock.timed_out(now):
                lease.abort.set("timeout")
        try:
            cancelled = self._db.cancels_among([lease.claim.run_id for lease in leases])
            for lease in leases:
                if lease.claim.run_id in cancelled:
                    lease.abort.set("cancel")
            due = [lease for lease in leases if lease.clock.renew_due(now)]
            if due:
                kept = self._db.renew_many([lease.claim for lease in due], conf.LEASE_SECONDS)
                renewed_at = time.monotonic()
                for lease in due:
                    if lease.claim.run_id in kept:
                        lease.clock.renewed(renewed_at)
                    else:
                        self._lost(lease)
            self._db.hand_back()
        except Exception:
            # About one execution, the record names it (as the execution's own records do).
            alone = log_context.of(leases[0].claim) if len(leases) == 1 else None
            with log_context.bound(alone):
                logger.warning("lease renewal of %d executions failed", len(leases), exc_info=True)
            connection.close()
            for lease in leases:
                if lease.clock.must_give_up(time.monotonic()):
                    self._lost(lease)

    def _lost(self, lease: Lease) -> None:
        # Past this point another worker may hold the run: the execution stops, writing nothing.
        with log_context.bound(log_context.of(lease.claim)):
            logger.warning("run %s: lease lost; the execution stops", lease.claim.run_id)
        lease.abort.set("lease_lost")
        self.release(lease)


keeper = LeaseKeeper()
"""The process's lease keeper."""
