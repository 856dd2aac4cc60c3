"""The doorbell: after a commit, tell whoever executes runs that one is ready. The mode
(``chamvi_runs.modes``) says who: RQ workers get a job, the embedded executor gets the id. Either
way the message carries only the run id: the database is the truth, a lost or duplicate doorbell is
harmless (the janitor re-rings; a claim refuses a taken run)."""

from __future__ import annotations

from django.db import transaction

from ..core.faults import crash_point
from ..models import Run
from ..modes import mode
from ..store import queries
from . import sites, versions


def enqueue(run_id: str, version: tuple[str, str] | None = None) -> None:
    """Ring the doorbell for ``run_id`` once the current transaction (if any) commits. ``version``:
    the run's agent and version, when the caller has them (a queued job carries them; it reads them
    otherwise)."""
    transaction.on_commit(lambda: _enqueue_now(run_id, version), robust=True)


def _enqueue_now(run_id: str, version: tuple[str, str] | None = None) -> None:
    crash_point("before_enqueue")
    mode().ring(run_id, lambda: {**sites.stamp(), **versions.stamp(run_id, version)})


def waiting_jobs() -> set[str]:
    """Ids of runs that have a job waiting, so the janitor rings no doorbell twice."""
    return mode().waiting_jobs()


def enqueue_next_in_line(run: Run) -> None:
    """After ``run`` settles: the oldest queued run of its concurrency key or thread may start."""
    for run_id in queries.next_in_line(run):
        enqueue(run_id)
