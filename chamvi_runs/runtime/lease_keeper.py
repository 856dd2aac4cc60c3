"""The lease keeper: a thread beside each execution that renews its lease, polls for cancellation
and watches the execution's deadline, setting the execution's abort signal when any of them says stop."""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

from . import queries, store
from .conf import conf
from .core.types import AbortSignal
from .store import Claim

logger = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    def __init__(self, claim: Claim, abort: AbortSignal, deadline: float | None) -> None:
        super().__init__(name=f"chamvi-lease-{claim.run_id}", daemon=True)
        self.claim = claim
        self.abort = abort
        self.deadline = deadline
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)

    def run(self) -> None:
        lease = float(conf.LEASE_SECONDS)
        heartbeat = float(conf.HEARTBEAT_SECONDS)
        poll = min(float(conf.CANCEL_POLL_SECONDS), heartbeat)
        renewed_at = time.monotonic()
        try:
            while not self._stop_event.wait(poll):
                now = time.monotonic()
                if self.deadline is not None and now >= self.deadline:
                    self.abort.set("timeout")
                try:
                    if queries.cancel_requested(self.claim.run_id):
                        self.abort.set("cancel")
                    if now - renewed_at >= heartbeat:
                        if not store.renew(self.claim, lease):
                            self.abort.set("lease_lost")
                            return
                        renewed_at = time.monotonic()
                except Exception:
                    logger.warning("lease renewal of run %s failed", self.claim.run_id, exc_info=True)
                    connection.close()
                    # Stop before the lease can run out under us: past that point another worker
                    # may hold the run, and our writes would be refused anyway.
                    if time.monotonic() - renewed_at > lease * 0.8:
                        self.abort.set("lease_lost")
                        return
        finally:
            connection.close()
