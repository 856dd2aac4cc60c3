"""Moving on the runs whose agent version no worker has any more (SPEC §14).

A run waits for a worker of its version as long as one may come back. Once none has been seen with
it for ``VERSION_GRACE_SECONDS`` (or at once, by ``manage.py chamvi_versions --apply``), its agent's
``on_version_change`` rule says what becomes of it. A version no worker ever had is never gone: it
is a release whose web processes started runs before its workers started, which must wait for
them. Once gone, the rule says: ``continue`` moves it to the version of this process, which
workers of that version then claim; ``fail`` settles it ``agent_version_gone``. Only a process
whose version of the agent some live worker has applies the rule: the rule is the new code's, and
a run moved to a version nobody executes would only wait again.

The admin moves a run by hand (``move_to_current``): the operator's decision, whatever the rule.
Every write is conditional (``store.move_version``, a claim and its settle), so a run that a worker
took, or another process moved, meanwhile is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from django.db.models import Q

from .. import store
from ..agents.agent import Agent, registry
from ..agents.versions import VersionChange, missing_tools, move
from ..conf import conf
from ..core.states import ErrorCode, Status
from ..dispatch.doorbell import enqueue
from ..models import Run
from ..store import versions as worker_versions
from .lifecycle import announce_settled
from .presence import presence

logger = logging.getLogger(__name__)

BATCH = 500
"""Runs looked at in one pass: the next pass takes the rest."""


class Moved(StrEnum):
    CONTINUED = "continued"
    """Moved to the current version, and on the queue for its workers."""
    FAILED = "failed"
    """Failed ``agent_version_gone``."""
    SKIPPED = "skipped"
    """Nothing: a worker took it, another process moved it, or it ended, meanwhile."""
    KEPT = "kept"
    """Nothing: its rule raised (logged), or this process's version of its agent is not one any
    live worker has; it waits on."""


@dataclass
class MoveReport:
    continued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def add(self, run_id: str, moved: Moved) -> None:
        if moved == Moved.CONTINUED:
            self.continued.append(run_id)
        elif moved == Moved.FAILED:
            self.failed.append(run_id)
        elif moved == Moved.KEPT:
            self.kept.append(run_id)


def move_gone() -> MoveReport:
    """Apply the rules to the runs whose version no worker has been seen with for
    ``VERSION_GRACE_SECONDS``: ``chamvi_tick``'s pass."""
    return _apply(timedelta(seconds=conf.VERSION_GRACE_SECONDS))


def move_missing() -> MoveReport:
    """Apply the rules now to every ready run of a version that some worker had and no live worker
    has: ``chamvi_versions --apply``, without the grace."""
    return _apply(timedelta(0))


def _apply(grace: timedelta) -> MoveReport:
    """Every ready run of a gone version of an agent whose version here a live worker has, page by
    page (oldest first): a run left where it is does not hold up those behind it."""
    report = MoveReport()
    live = store.live_versions()
    mine = {
        name: version for name, version in registry.versions().items() if version in live.get(name, set())
    }
    if not mine:
        return report
    first: dict[tuple[str, str], datetime] | None = None
    gone = Run.objects.filter(worker_versions.ready(), worker_versions.version_gone(grace), agent__in=mine)
    after: Q | None = None
    while True:
        page = list((gone.filter(after) if after is not None else gone).order_by("created_at", "id")[:BATCH])
        if page and first is None:
            first = store.first_seen()  # read only on a pass that has runs to move: most have none
        for run in page:
            report.add(run.pk, _move(run, registry.get(run.agent), first or {}))
        if len(page) < BATCH:
            return report
        last = page[-1]
        after = Q(created_at__gt=last.created_at) | Q(created_at=last.created_at, id__gt=last.pk)


def _move(run: Run, agent: Agent, first: dict[tuple[str, str], datetime]) -> Moved:
    old_since, new_since = first.get((agent.name, run.agent_version)), first.get((agent.name, agent.version))
    if old_since is None or new_since is None or new_since <= old_since:
        # This process's release came first: the run's is the newer one, whose workers are down
        # (a rollback, or a crash of a deploy's new workers). Its own release's rule moves it on,
        # or an operator does (the admin's move): old code never takes a newer run on its own.
        return Moved.KEPT
    return apply_rule(run, agent)


def apply_rule(run: Run, agent: Agent) -> Moved:
    old = run.agent_version
    change = VersionChange(run=run, old=old, new=agent.version, called=store.called_tools(run.pk))
    try:
        said = move(agent, change)
    except Exception:
        logger.exception("run %s: on_version_change of agent %r raised; the run waits on", run.pk, agent.name)
        return Moved.KEPT
    if said == "continue":
        return _continue(run, old, agent.version)
    missing = missing_tools(agent, change.called)
    reason = f"version {old} of agent {agent.name!r} is gone from every worker" + (
        f", and version {agent.version} has no tool {', '.join(map(repr, missing))}" if missing else ""
    )
    return _fail(run, old, reason)


def move_to_current(run_id: str) -> Moved:
    """The admin's move: the run goes on at this process's version of its agent, whatever its rule
    says. Raises ``AgentNotFound`` when this process has no such agent."""
    run = Run.objects.only("id", "agent", "agent_version").get(pk=run_id)
    agent = registry.get(run.agent)
    if run.agent_version == agent.version:
        return Moved.SKIPPED
    return _continue(run, run.agent_version, agent.version)


def _continue(run: Run, old: str, new: str) -> Moved:
    if not store.move_version(run.pk, old, new):
        return Moved.SKIPPED
    logger.info("run %s of agent %r moved from version %s to %s", run.pk, run.agent, old, new)
    enqueue(run.pk, (run.agent, new))
    return Moved.CONTINUED


def _fail(run: Run, old: str, reason: str) -> Moved:
    # A run settles only through a claim, along the transitions (queued -> running -> failed); one
    # of ``old`` only, so a run another process moved meanwhile is left to its new workers.
    claim = store.claim(run.pk, f"version-rule:{presence.name}", conf.LEASE_SECONDS, {run.agent: old})
    if claim is None:
        return Moved.SKIPPED
    if claim.cancel_requested:
        # Cancelled while a worker held it, which died: the cancel is what the user asked for.
        settled = store.settle(claim, Status.CANCELLED)
    else:
        settled = store.settle(
            claim,
            Status.FAILED,
            error_code=ErrorCode.AGENT_VERSION_GONE.value,
            error_message=reason,
            close_history="The call was not run: the agent's version it was made for is gone.",
        )
    if not settled:
        return Moved.SKIPPED  # the claim was lost (its lease ran out meanwhile): nothing written
    announce_settled(run.pk)
    if claim.cancel_requested:
        return Moved.SKIPPED
    logger.warning("run %s failed: %s", run.pk, reason)
    return Moved.FAILED
