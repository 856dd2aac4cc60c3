"""Agent versions across a deploy (SPEC §14): which versions the processes that execute runs have
(``WorkerVersion``, each process's own rows), which runs wait for a version none of them has, and
the one conditional write that moves a run to another version.

Times are the database's: a process is live until the time it last set (a lease's length after it
said so; it says so every heartbeat, as a lease is renewed) unless it stopped; a version is gone
once some process had it and none has been seen with it for the grace a caller gives. Which of
two versions is the newer is which processes had first (``first_seen``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, Min, OuterRef, Q, QuerySet
from django.db.models.functions import Now

from ..core.states import ACTIVE, CLAIMABLE, TERMINAL
from ..models import Run, Step, WaitPoint, WorkerVersion
from .fence import admissible, db_now_plus, effect_lock, free, in_seconds


def beat(worker: str, versions: dict[str, str], lease_seconds: float) -> None:
    """``worker`` is alive, for ``lease_seconds`` more, and has ``versions`` (agent -> version): one
    upsert of its rows."""
    if not versions:
        return
    WorkerVersion.objects.bulk_create(
        [
            WorkerVersion(
                worker=worker,
                agent=agent,
                version=version,
                seen_at=Now(),
                live_until=in_seconds(lease_seconds),
                stopped_at=None,
            )
            for agent, version in versions.items()
        ],
        update_conflicts=True,
        unique_fields=["worker", "agent"],
        update_fields=["version", "seen_at", "live_until", "stopped_at"],
    )


def stop_worker(worker: str) -> None:
    """``worker`` stopped cleanly: its versions are not live from now on (the grace counts from now)."""
    WorkerVersion.objects.filter(worker=worker).update(stopped_at=Now(), seen_at=Now(), live_until=Now())


def forget_workers(older_than: timedelta) -> int:
    """Delete the rows of processes not seen for ``older_than``, but those of a version some active
    run records: that they were seen is what tells a gone version from one not started yet."""
    recorded = Run.objects.filter(
        agent=OuterRef("agent"), agent_version=OuterRef("version"), status__in=[s.value for s in ACTIVE]
    )
    old = WorkerVersion.objects.filter(seen_at__lt=db_now_plus(-older_than)).exclude(Exists(recorded))
    deleted, _ = old.delete()
    return deleted


def live() -> QuerySet[WorkerVersion]:
    """The rows of live processes, by the database's clock."""
    return WorkerVersion.objects.filter(stopped_at__isnull=True, live_until__gt=Now())


def live_versions() -> dict[str, set[str]]:
    """Each agent's versions that some live process has."""
    found: dict[str, set[str]] = defaultdict(set)
    for agent, version in live().values_list("agent", "version").distinct():
        found[agent].add(version)
    return dict(found)


def is_live(agent: str, version: str) -> bool:
    return live().filter(agent=agent, version=version).exists()


def was_seen(agent: str, version: str) -> bool:
    """Whether a process on record ever had ``version`` of ``agent``."""
    return WorkerVersion.objects.filter(agent=agent, version=version).exists()


def ready() -> Q:
    """Runs a worker would claim now: claimable, and no live claim holds them."""
    return Q(status__in=[s.value for s in CLAIMABLE]) & free()


def version_missing() -> Q:
    """Runs whose version no live process has, while some process is live: they wait for a worker
    of their version (with none live at all, every run waits for workers, whatever its version).
    A run recorded before versions were (``agent_version`` empty) is any worker's."""
    same = live().filter(agent=OuterRef("agent"), version=OuterRef("agent_version"))
    return ~Q(agent_version="") & Exists(live()) & ~Exists(same)


def version_gone(grace: timedelta) -> Q:
    """Runs whose version is missing, which some process had, and none has been seen with for
    ``grace``: a stopped one counts from when it stopped, one that died from its last heartbeat. A
    version no process ever had is not gone: it is a release whose workers have not started yet
    (its web processes start runs first), or one that never had any."""
    seen = WorkerVersion.objects.filter(agent=OuterRef("agent"), version=OuterRef("agent_version"))
    recent = seen.filter(seen_at__gte=db_now_plus(-grace))
    return version_missing() & Q(Exists(seen)) & ~Q(Exists(recent))


def move_version(run_id: str, old: str, new: str) -> bool:
    """Move a run no live claim holds from version ``old`` to ``new``: workers of ``new`` claim it
    from now on. A claim whose lease expired is ended with it, as a new claim would end it: the
    attempt grows, so its holder, back from a partition, writes nothing more on ``old``'s code; and,
    like a claim, this never waits for an effect of that holder still in its transaction (False).
    False also when another process moved or claimed it meanwhile, or it ended."""
    with transaction.atomic():
        row = (
            Run.objects.select_for_update(skip_locked=True)
            .filter(free(), pk=run_id, agent_version=old)
            .exclude(status__in=[s.value for s in TERMINAL])
            .values_list("claim_owner", flat=True)
        )
        found = list(row)
        if not found:
            return False
        if found[0] is not None and not effect_lock(run_id, wait=False):
            return False
        fields: dict[str, Any] = {"agent_version": new, "updated_at": Now()}
        if found[0] is not None:
            fields.update(claim_owner=None, claim_expires_at=None, attempt=F("attempt") + 1)
        return bool(Run.objects.filter(free(), pk=run_id, agent_version=old).update(**fields))


def first_seen() -> dict[tuple[str, str], datetime]:
    """When each (agent, version) was first had by a process still on record: which of two
    versions is the newer release."""
    rows = WorkerVersion.objects.values_list("agent", "version").annotate(first=Min("started_at"))
    return {(agent, version): first for agent, version, first in rows}


def ready_runs_of(versions: dict[str, str]) -> list[tuple[str, str, str]]:
    """The ready runs (id, agent, version) of ``versions`` (agent -> version), oldest first: those a
    process that just started with these versions may take (their jobs were dropped meanwhile)."""
    if not versions:
        return []
    which = Q(pk__in=[])
    for agent, version in versions.items():
        which |= Q(agent=agent, agent_version=version)
    # Not one behind an elder of its concurrency key or thread: the elder's settle rings for it.
    return list(
        Run.objects.filter(ready(), which, admissible())
        .order_by("created_at", "id")
        .values_list("pk", "agent", "agent_version")[:500]
    )


def called_tools(run_id: str) -> frozenset[str]:
    """The tools a run's history called, or asked an approval or an answer for."""
    ran = Step.objects.filter(run_id=run_id, kind=Step.Kind.TOOL).values_list("name", flat=True)
    asked = WaitPoint.objects.filter(run_id=run_id).values_list("tool_name", flat=True)
    return frozenset(ran) | frozenset(asked)
