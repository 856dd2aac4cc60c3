"""The lease keeper: a thread beside each execution that renews its lease, polls for cancellation
and watches the execution's deadline, setting the execution's abort signal when any of them says
stop. When to do what is ``core.lease.LeaseClock``'s arithmetic."""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

from ..conf import conf
from ..core.lease import LeaseClock
from ..core.ports import Store
from ..core.records import Claim
from ..core.types import AbortSignal

logger = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    def __init__(self, claim: Claim, abort: AbortSignal, deadline: float | None, db: Store) -> None:
        super().__init__(name=f"chamvi-lease-{claim.run_id}", daemon=True)
        self.claim = claim
        self.abort = abort
        self.deadline = deadline
        self.db = db
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)

    def run(self) -> None:
        clock = LeaseClock(
            lease=conf.LEASE_SECONDS,
            heartbeat=conf.HEARTBEAT_SECONDS,
            cancel_poll=conf.CANCEL_POLL_SECONDS,
            deadline=self.deadline,
            renewed_at=time.monotonic(),
        )
        try:
            while not self._stop_event.wait(clock.poll):
                now = time.monotonic()
                if clock.timed_out(now):
                    self.abort.set("timeout")
                try:
                    if self.db.cancel_requested(self.claim.run_id):
                        self.abort.set("cancel")
                    if clock.renew_due(now):
                        if not self.db.renew(self.claim, clock.lease):
                            self.abort.set("lease_lost")
                            return
                        clock.renewed(time.monotonic())
                except Exception:
                    logger.warning("lease renewal of run %s failed", self.claim.run_id, exc_info=True)
                    connection.close()
                    if clock.must_give_up(time.monotonic()):
                        self.abort.set("lease_lost")
                        return
        finally:
            connection.close()
