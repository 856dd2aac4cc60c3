"""A read-only admin: runs change only through actions, which call the same API as everything else.

Nothing of run state is added, changed or deleted here: a change form's save is a full-row UPDATE of
status, claim and attempt with values read a moment earlier (no fence), and deleting a live run's
checkpoint silently restarts it from its trigger. Each action has its own permission."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.debug import sensitive_variables

from . import api
from .models import ApiToken, Checkpoint, Run, Step, StuckRun, WaitPoint
from .runtime.janitor import Requeued, requeue
from .store.queries import Stuck, stuck_runs
from .web.approvals import decide
from .web.auth import create_token
from .web.errors import ApiError


class ReadOnly:
    """Whatever permissions a staff user holds: no add, no change form save, no delete (which also
    removes the "delete selected" action)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


STEP_FIELDS = ("index", "kind", "name", "error", "attempt", "started_at", "finished_at")
WAITPOINT_FIELDS = ("approval_id", "tool_name", "input", "expires_at", "decision", "decided_by", "reason")


class StepInline(ReadOnly, admin.TabularInline):
    model = Step
    extra = 0
    fields = readonly_fields = STEP_FIELDS
    show_change_link = False


class WaitPointInline(ReadOnly, admin.TabularInline):
    model = WaitPoint
    extra = 0
    fields = readonly_fields = WAITPOINT_FIELDS


def _may_approve(user: Any, run: Run | None = None) -> bool:
    """The admin's actions decide with this permission, whatever the site's policy (which the pages,
    the API and the websocket ask) says."""
    return bool(user.has_perm("chamvi_runs.approve_waitpoint"))


def _decide(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, waitpoints: QuerySet[WaitPoint], approve: bool
) -> None:
    decided = 0
    for approval_id in waitpoints.values_list("approval_id", flat=True):
        try:
            decide(request.user, approval_id, approve, reason="from the admin", may_decide=_may_approve)
            decided += 1
        except ApiError as exc:
            modeladmin.message_user(request, exc.message, messages.WARNING)
    if decided:
        verb = "Approved" if approve else "Denied"
        modeladmin.message_user(request, f"{verb} {decided} approval(s).", messages.SUCCESS)


@admin.register(Run)
class RunAdmin(ReadOnly, admin.ModelAdmin):
    list_display = [
        "id",
        "agent",
        "status",
        "thread",
        "model_calls",
        "input_tokens",
        "output_tokens",
        "created_at",
    ]
    list_filter = ["status", "agent"]
    search_fields = ["id", "thread", "concurrency_key", "trigger_id"]
    date_hierarchy = "created_at"
    inlines = [StepInline, WaitPointInline]
    actions = ["cancel_runs", "approve_open", "deny_open"]

    def view_on_site(self, obj: Run) -> str:
        """The run's chat page: its conversation, decisions and live events."""
        return obj.get_absolute_url()

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.cancel_run")

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        statuses = [api.cancel_run(run.pk, by=request.user) for run in queryset]
        self.message_user(request, f"Cancel requested for {len(statuses)} run(s).", messages.SUCCESS)

    @admin.action(description="Approve the open approval of selected runs", permissions=["approve"])
    def approve_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), True)

    @admin.action(description="Deny the open approval of selected runs", permissions=["approve"])
    def deny_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), False)

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return _may_approve(request.user)


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


@admin.register(StuckRun)
class StuckRunAdmin(ReadOnly, admin.ModelAdmin):
    """Runs nothing is moving on (``store.queries.stuck_runs``), with an action that does for them
    now what ``chamvi_tick`` does once they are due. A queued run is stuck after ``queued_after``: a
    site changes it by registering a subclass instead (``admin.site.unregister(StuckRun)`` first)."""

    queued_after = timedelta(minutes=10)
    list_display = ["run_id", "agent", "why_stuck", "attempt", "claim_owner", "created_at"]
    list_display_links = None
    list_filter = [StuckReasonFilter, "agent"]
    search_fields = ["id"]
    actions = ["requeue_runs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[StuckRun]:
        return stuck_runs(super().get_queryset(request), self.queued_after)

    @admin.display(description="id", ordering="id")
    def run_id(self, run: StuckRun) -> SafeString:
        """The run's own admin page, with its steps and wait points."""
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:chamvi_runs_run_change", args=[quote(run.pk)]), run.pk
        )

    @admin.display(description="why stuck", ordering="stuck_for")
    def why_stuck(self, run: StuckRun) -> str:
        span = _span(run.stuck_for)
        if run.stuck_reason == Stuck.LEASE_EXPIRED:
            return f"lease expired {span} ago (worker {_worker(run.claim_owner)})"
        if run.stuck_reason == Stuck.QUEUED:
            return f"queued {span}"
        return f"approval expired {span} ago"

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.requeue_run")

    @admin.action(description="Requeue selected stuck runs", permissions=["requeue"])
    def requeue_runs(self, request: HttpRequest, queryset: QuerySet[StuckRun]) -> None:
        # The queryset is the selection as stuck_runs sees it now: a selected run missing from it is
        # no longer stuck (a worker took it, it was decided or settled) and is left alone.
        stuck = list(queryset.values_list("pk", flat=True))
        for run_id in sorted(set(request.POST.getlist(ACTION_CHECKBOX_NAME)) - set(stuck)):
            self.message_user(request, f"{run_id} is no longer stuck: skipped.", messages.WARNING)
        for run_id in stuck:
            self._report(request, run_id, requeue(run_id))

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


@admin.register(WaitPoint)
class WaitPointAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["approval_id", "run", "tool_name", "decision", "expires_at", "notified_at", "created_at"]
    list_filter = ["decision", "tool_name"]
    actions = ["approve", "deny"]
    exclude = ["token_hash"]

    def view_on_site(self, obj: WaitPoint) -> str:
        return obj.run.get_absolute_url()

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return _may_approve(request.user)

    @admin.action(description="Approve selected", permissions=["approve"])
    def approve(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, True)

    @admin.action(description="Deny selected", permissions=["approve"])
    def deny(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, False)


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["run", "step_index", "finish_reason", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """A token acts as its user: staff mint and see only their own; superusers, anyone's."""

    list_display = ["name", "user", "prefix", "created_at", "last_used_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("user", "name") if request.user.is_superuser else ("name",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        tokens = super().get_queryset(request)
        return tokens if request.user.is_superuser else tokens.filter(user=request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_staff

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @sensitive_variables("raw")
    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        owner = obj.user if request.user.is_superuser else request.user
        token, raw = create_token(owner, obj.name)
        obj.pk = token.pk
        self.message_user(
            request, f"API token created. Copy it now, it is not shown again: {raw}", messages.SUCCESS
        )
