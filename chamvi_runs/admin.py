"""A read-only admin: runs change only through actions, which call the same API as everything else.

Nothing of run state is added, changed or deleted here: a change form's save is a full-row UPDATE of
status, claim and attempt with values read a moment earlier (no fence), and deleting a live run's
checkpoint silently restarts it from its trigger. Each action has its own permission."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.views.decorators.debug import sensitive_variables

from . import api
from .models import ApiToken, Checkpoint, Run, Step, WaitPoint
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
