"""``manage.py chamvi_versions``: during and after a deploy, which agent versions the live workers
have, and the runs still in flight on each version (SPEC §14).

``--apply`` moves on, now, the runs ready for a worker whose version is gone (workers had it, no
live one has, and it is older than this process's): each agent's ``on_version_change`` rule
continues them on this process's version or fails them, as ``chamvi_tick`` does once
``VERSION_GRACE_SECONDS`` have passed. Run it from the new release, once the old workers are gone
for good."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count

from chamvi_runs import store
from chamvi_runs.agents.agent import registry
from chamvi_runs.core.states import ACTIVE
from chamvi_runs.models import Run
from chamvi_runs.runtime.version_moves import move_missing


class Command(BaseCommand):
    help = (
        "List the agent versions of live workers and of runs in flight; "
        "--apply moves on the runs of versions no live worker has."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--apply",
            action="store_true",
            help="Apply each agent's on_version_change rule now to the runs waiting for an older "
            "version that workers had and no live worker has.",
        )

    def handle(self, *args: Any, apply: bool, verbosity: int, **options: Any) -> None:
        if apply:
            report = move_missing()
            for run_id in report.continued:
                self.stdout.write(f"{run_id}: moved to the current version")
            for run_id in report.failed:
                self.stdout.write(f"{run_id}: failed agent_version_gone")
            for run_id in report.kept:
                self.stdout.write(
                    f"{run_id}: waits on (its version is newer than this process's, or its rule raised)"
                )
            self.stdout.write(
                f"moved {len(report.continued)}, failed {len(report.failed)}, left {len(report.kept)}"
            )
            return
        live = store.live_versions()
        mine = registry.versions()
        in_flight = (
            Run.objects.filter(status__in=[s.value for s in ACTIVE])
            .values("agent", "agent_version", "status")
            .annotate(runs=Count("id"))
            .order_by("agent", "agent_version", "status")
        )
        counts: dict[tuple[str, str], list[str]] = {}
        for row in in_flight:
            counts.setdefault((row["agent"], row["agent_version"]), []).append(
                f"{row['runs']} {row['status']}"
            )
        agents = sorted({*live, *mine, *(agent for agent, _ in counts)})
        if not agents:
            self.stdout.write("No agents, no live workers, no runs in flight.")
        for agent in agents:
            self.stdout.write(f"{agent} (this process: {mine.get(agent, 'no such agent')})")
            versions = sorted(live.get(agent, set()) | {v for a, v in counts if a == agent})
            for version in versions:
                workers = "live workers" if version in live.get(agent, set()) else "NO live worker"
                runs = ", ".join(counts.get((agent, version), [])) or "no runs in flight"
                label = version or "(recorded before versions)"
                self.stdout.write(f"  {label}: {workers}; {runs}")
