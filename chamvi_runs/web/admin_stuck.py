"""The admin's list of stuck runs (``chamvi_runs/admin.py`` registers it): why each is stuck and
for how long, and actions that requeue them now, move a run waiting for an agent version no worker
has to the current one, or cancel them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from .. import api, store
from ..agents.agent import registry
from ..errors import AgentNotFound
from ..models import Run, StuckRun, WorkerVersion
from ..runtime.janitor import Requeued, requeue
from ..runtime.version_moves import Moved, move_to_current
from ..store import versions as worker_versions
from ..store.queries import Stuck, stuck_runs
from .admin_lists import AgentFilter, ReadOnly, Storable, run_link


def _span(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _worker(owner: str | None) -> str:
    """host:pid of a claim owner (host:pid:thread:nonce)."""
    return owner.rsplit(":", 2)[0] if owner else "none"


class StuckReasonFilter(admin.SimpleListFilter):
    title = "why stuck"
    parameter_name = "reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, str(label)) for value, label in Stuck.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(stuck_reason=self.value()) if self.value() else queryset


class StuckRunAdmin(Storable, ReadOnly, admin.ModelAdmin):
    """Runs nothing is moving on (``store.queries.stuck_runs``), with an action that does for them
    now what ``chamvi_tick`` does once they are due. A queued run is stuck after ``queued_after``: a
    site changes it by registering a subclass instead (``admin.site.unregister(StuckRun)`` first)."""

    queued_after = timedelta(minutes=10)
    list_display = ["run_id", "agent", "why_stuck", "attempt", "claim_owner", "created_at"]
    list_display_links = None
    list_filter = [StuckReasonFilter, AgentFilter]
    list_defer = ("trigger", "output", "error_message", "listed_tools")
    show_full_result_count = False
    search_fields = ["id"]
    actions = ["requeue_runs", "move_to_current_version", "cancel_runs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[StuckRun]:
        return stuck_runs(super().get_queryset(request), self.queued_after)

    @admin.display(description="id", ordering="id")
    def run_id(self, run: StuckRun) -> SafeString:
        """The run's own admin page, with its steps and wait points."""
        return run_link(run.pk)

    @admin.display(description="why stuck", ordering="stuck_for")
    def why_stuck(self, run: StuckRun) -> str:
        span = _span(run.stuck_for)
        if run.stuck_reason == Stuck.LEASE_EXPIRED:
            return f"lease expired {span} ago (worker {_worker(run.claim_owner)})"
        if run.stuck_reason == Stuck.QUEUED:
            return f"queued {span}"
        if run.stuck_reason == Stuck.CHILD_STUCK:
            return f"waiting {span} for child run {run.stuck_child}, which is stuck"
        if run.stuck_reason == Stuck.VERSION:
            return f"waiting {span} for version {run.agent_version}, which no live worker has"
        return f"approval expired {span} ago"

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.requeue_run")

    @admin.action(description="Requeue selected stuck runs", permissions=["requeue"])
    def requeue_runs(self, request: HttpRequest, queryset: QuerySet[StuckRun]) -> None:
        # The queryset is the selection as stuck_runs sees it now: a selected run missing from it is
        # no longer stuck (a worker took it, it was decided or settled) and is left alone.
        rows = list(queryset.only("pk", "agent_version"))
        stuck = {run.pk: run.stuck_child for run in rows if run.stuck_reason != Stuck.VERSION}
        for run_id in sorted(set(request.POST.getlist(ACTION_CHECKBOX_NAME)) - {run.pk for run in rows}):
            self.message_user(request, f"{run_id} is no longer stuck: skipped.", messages.WARNING)
        for run in rows:
            if run.stuck_reason == Stuck.VERSION:
                # A job would only be dropped again: no live worker has its version.
                self.message_user(
                    request,
                    f"Run {run.pk} waits for version {run.agent_version}, which no live worker has: start "
                    "a worker that has it, or move the run to the current version.",
                    messages.WARNING,
                )
        children = [child for child in stuck.values() if child]
        waiting_children = {
            row.pk
            for row in stuck_runs(StuckRun.objects.filter(pk__in=children), self.queued_after).only("pk")
            if row.stuck_reason == Stuck.VERSION
        }
        for run_id, child in stuck.items():
            if child in waiting_children:
                self.message_user(
                    request,
                    f"Run {run_id} waits for its child run {child}, which waits for a version no live "
                    "worker has: move the child to the current version.",
                    messages.WARNING,
                )
                continue
            # A parent stuck on its child run moves once the child does: the child is requeued.
            self._report(request, child or run_id, requeue(child or run_id))

    @admin.action(
        description="Move selected runs to the current version of their agent", permissions=["requeue"]
    )
    def move_to_current_version(self, request: HttpRequest, queryset: QuerySet[StuckRun]) -> None:
        # The operator's decision, whatever the agent's on_version_change rule: a run waiting for a
        # version no live worker has goes on at the version this site's code has now (SPEC §14),
        # also back to an older one after a rollback; its workers claim it.
        live = store.live_versions()
        for run in queryset.only("pk", "agent", "agent_version"):
            if run.stuck_reason != Stuck.VERSION:
                self.message_user(
                    request, f"Run {run.pk} is not waiting for a version: skipped.", messages.WARNING
                )
                continue
            try:
                current = registry.get(run.agent).version
            except AgentNotFound:
                self.message_user(
                    request, f"Run {run.pk}: this site has no agent {run.agent!r} any more.", messages.ERROR
                )
                continue
            if current not in live.get(run.agent, set()):
                self.message_user(
                    request,
                    f"Run {run.pk} stays: no live worker has version {current} of {run.agent!r} either "
                    "(this web process is not of the release the workers run).",
                    messages.ERROR,
                )
                continue
            if move_to_current(run.pk) == Moved.CONTINUED:
                self.message_user(request, f"Run {run.pk} goes on at version {current}.", messages.SUCCESS)
            else:
                self.message_user(
                    request, f"Run {run.pk} was moved or taken meanwhile: skipped.", messages.WARNING
                )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.cancel_run")

    @admin.action(description="Cancel selected stuck runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[StuckRun]) -> None:
        for run_id in queryset.values_list("pk", flat=True):
            status = api.cancel_run(run_id, by=request.user)
            said = "is cancelled" if status == "cancelled" else f"is {status}"
            if status == "running":
                said = "is running: its worker stops it within seconds"
            self.message_user(request, f"Run {run_id} {said}.", messages.SUCCESS)

    def _report(self, request: HttpRequest, run_id: str, outcome: Requeued) -> None:
        if outcome == Requeued.ENQUEUED:
            self.message_user(
                request, f"{run_id} is on the queue again: a worker will claim it.", messages.SUCCESS
            )
        elif outcome == Requeued.EXPIRED:
            status = Run.objects.get(pk=run_id).status
            self.message_user(
                request, f"{run_id}: its approval expired; the run is {status} now.", messages.SUCCESS
            )
        elif outcome == Requeued.JOB_WAITING:
            self.message_user(
                request,
                f"{run_id} already has a job waiting in the queue: are workers running, or all busy?",
                messages.WARNING,
            )
        else:
            self.message_user(
                request, f"{run_id} was decided or cancelled meanwhile: skipped.", messages.WARNING
            )


class WorkerVersionAdmin(Storable, ReadOnly, admin.ModelAdmin):
    """Which agent versions the processes that execute runs have, and whether each is live: during a
    deploy, which runs any worker can take (SPEC §14)."""

    list_display = ["worker", "agent", "version", "state", "started_at", "seen_at"]
    list_filter = ["agent", "version"]
    search_fields = ["worker", "agent", "version"]
    ordering = ["agent", "-seen_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerVersion]:
        live = worker_versions.live().filter(pk=OuterRef("pk"))
        rows: QuerySet[WorkerVersion] = super().get_queryset(request)
        return rows.annotate(is_live=Exists(live))

    @admin.display(description="state")
    def state(self, row: WorkerVersion) -> str:
        if getattr(row, "is_live", False):
            return "live"
        return "stopped" if row.stopped_at else "not seen for a lease (died?)"
