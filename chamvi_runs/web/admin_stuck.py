"""The admin's list of stuck runs (``chamvi_runs/admin.py`` registers it): why each is stuck and
for how long, and an action that requeues them now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from ..models import Run, StuckRun
from ..runtime.janitor import Requeued, requeue
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
    list_defer = ("trigger", "output", "error_message")
    show_full_result_count = False
    search_fields = ["id"]
    actions = ["requeue_runs"]

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
        return f"approval expired {span} ago"

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.requeue_run")

    @admin.action(description="Requeue selected stuck runs", permissions=["requeue"])
    def requeue_runs(self, request: HttpRequest, queryset: QuerySet[StuckRun]) -> None:
        # The queryset is the selection as stuck_runs sees it now: a selected run missing from it is
        # no longer stuck (a worker took it, it was decided or settled) and is left alone.
        stuck = {run.pk: run.stuck_child for run in queryset.only("pk")}
        for run_id in sorted(set(request.POST.getlist(ACTION_CHECKBOX_NAME)) - set(stuck)):
            self.message_user(request, f"{run_id} is no longer stuck: skipped.", messages.WARNING)
        for run_id, child in stuck.items():
            # A parent stuck on its child run moves once the child does: the child is requeued.
            self._report(request, child or run_id, requeue(child or run_id))

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
