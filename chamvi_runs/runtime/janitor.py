"""The periodic janitor behind ``manage.py chamvi_tick``. Safe to run in several processes at once:
every action is a conditional write or a duplicate doorbell, both harmless when repeated."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from .. import store
from ..agents.agent import registry
from ..conf import conf
from ..dispatch.doorbell import enqueue, waiting_jobs
from ..errors import AgentNotFound, DecisionRefused
from ..models import Run, WaitPoint
from ..store import queries
from . import version_moves
from .lifecycle import announce_settled, cancel_now, wake_parent
from .notifications import notify

logger = logging.getLogger(__name__)

FORGET_WORKERS_AFTER = timedelta(days=1)
"""How long the versions of a process that stopped, or died, are kept (``store.versions``)."""


@dataclass
class TickReport:
    enqueued: int = 0
    """Runs put on the queue again: ``recovered`` of them had a claim whose lease expired, the
    others' jobs were lost (queued, interrupted, or running and released, and quiet for a while)."""
    recovered: int = 0
    expired: int = 0
    """Open approvals past their expiry that were expired (the run goes on, or fails)."""
    notified: int = 0
    """Notifications re-sent."""
    woken: int = 0
    """Parents woken by a child that settled in a process that died before waking them."""
    orphans: int = 0
    """Child runs cancelled because their parent settled, in a process that died before it
    cancelled them."""
    moved: int = 0
    """Runs of an agent version gone from every worker that their agent's rule moved to the
    current version (SPEC §14)."""
    version_failed: int = 0
    """Runs of an agent version gone from every worker that their agent's rule failed."""

    @property
    def requeued(self) -> int:
        """Runs whose job was lost, put on the queue again."""
        return self.enqueued - self.recovered

    @property
    def quiet(self) -> bool:
        """Nothing was due: the tick did nothing."""
        return not (
            self.enqueued
            or self.expired
            or self.notified
            or self.woken
            or self.orphans
            or self.moved
            or self.version_failed
        )


def tick_once() -> TickReport:
    report = TickReport()
    # The database is the truth; the queue is only a doorbell that may have been lost.
    waiting = waiting_jobs()
    due = [r for r in queries.runs_to_enqueue(stale_after_seconds=conf.LEASE_SECONDS) if r not in waiting]
    if due:
        # Told apart for the report only, before a worker claims one: both get the same doorbell.
        report.recovered = Run.objects.filter(queries.lease_expired(), pk__in=due).count()
    for run_id in due:
        enqueue(run_id)
    report.enqueued = len(due)
    for waitpoint in queries.expired_waitpoints():
        if _expire(waitpoint):
            report.expired += 1
    for waitpoint in queries.unnotified_waitpoints():
        if _renotify(waitpoint):
            report.notified += 1
    report.woken = sum(wake_parent(child) for child in store.settled_unannounced())
    report.orphans = sum(cancel_now(orphan) for orphan in store.orphans())
    moves = version_moves.move_gone()
    report.moved, report.version_failed = len(moves.continued), len(moves.failed)
    store.forget_workers(FORGET_WORKERS_AFTER)
    return report


def _expire(waitpoint: WaitPoint) -> bool:
    try:
        agent = registry.get(waitpoint.run.agent)
        # A question that expires is answered "no answer came": the model decides what then.
        fail = agent.on_approval_expired == "fail" and waitpoint.kind == WaitPoint.Kind.APPROVAL
    except AgentNotFound:
        fail = False
    if fail:
        if not store.fail_expired_wait(waitpoint.approval_id):
            return False
        announce_settled(waitpoint.run_id)
        return True
    try:
        decided = store.decide(
            waitpoint.approval_id, WaitPoint.Decision.EXPIRED, reason="no decision before expiry"
        )
    except DecisionRefused:
        return False
    if decided.resumes:
        enqueue(waitpoint.run_id)
    return True


class Requeued(StrEnum):
    """What ``requeue`` did."""

    ENQUEUED = "enqueued"
    """A job is on the queue: a worker claims the run (an expired lease is free to take)."""
    JOB_WAITING = "job waiting"
    """Nothing: a job of the run waits in the queue already, which no worker has taken: workers are
    down or busy, and a second job would wait behind the first."""
    EXPIRED = "expired"
    """Its open approval expired, as the tick expires one: the run goes on, or fails (its agent's
    ``on_approval_expired``)."""
    DECIDED = "decided"
    """Nothing: its approval was decided, or the run cancelled, a moment ago."""


def requeue(run_id: str) -> Requeued:
    """Do now for one run what the tick does once it is due, whatever the tick's thresholds: the
    admin's requeue of a stuck run (``queries.stuck_runs``). An open approval past its expiry (by the
    database's clock) is expired; any other run gets a doorbell, which a claim refuses for a run
    that no worker may take."""
    expired = queries.expired_waitpoints(run_id)
    if expired:
        return Requeued.EXPIRED if _expire(expired[0]) else Requeued.DECIDED
    if run_id in waiting_jobs():
        return Requeued.JOB_WAITING
    enqueue(run_id)
    return Requeued.ENQUEUED


def _renotify(waitpoint: WaitPoint) -> bool:
    try:
        agent = registry.get(waitpoint.run.agent)
    except AgentNotFound:
        return False
    return notify(agent, waitpoint.run, waitpoint, resend=True)
