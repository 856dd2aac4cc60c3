"""Lease arithmetic of one execution, on the monotonic clock of its process: when to poll for a
cancel, when to renew, when the execution's deadline has passed, and when to stop trying because
the lease may have run out under us."""

from __future__ import annotations

from dataclasses import dataclass

# Renewals failing for this share of the lease: stop before it can run out under us, since past
# that point another worker may hold the run and our writes would be refused anyway.
GIVE_UP_AFTER = 0.8


@dataclass
class LeaseClock:
    lease: float
    heartbeat: float
    cancel_poll: float
    deadline: float | None
    renewed_at: float

    @property
    def poll(self) -> float:
        return min(self.cancel_poll, self.heartbeat)

    def timed_out(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def renew_due(self, now: float) -> bool:
        return now - self.renewed_at >= self.heartbeat

    def renewed(self, now: float) -> None:
        self.renewed_at = now

    def must_give_up(self, now: float) -> bool:
        return now - self.renewed_at > self.lease * GIVE_UP_AFTER
