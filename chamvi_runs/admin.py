"""A read-only admin: runs change only through actions, which call the same API as everything else."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import api
from .auth import create_token
from .errors import DecisionRefused
from .models import ApiToken, Checkpoint, Run, Step, WaitPoint


class ReadOnly:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(ReadOnly, admin.TabularInline):
    model = Step
    extra = 0
    fields = ["index", "kind", "name", "error", "attempt", "started_at", "finished_at"]
    readonly_fields = fields
    show_change_link = False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WaitPointInline(ReadOnly, admin.TabularInline):
    model = WaitPoint
    extra = 0
    fields = ["approval_id", "tool_name", "input", "expires_at", "decision", "decided_by", "reason"]
    readonly_fields = fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _decide(modeladmin: admin.ModelAdmin, request: HttpRequest, waitpoints: Any, approve: bool) -> None:
    decided = 0
    for waitpoint in waitpoints:
        try:
            (api.approve if approve else api.deny)(
                waitpoint.approval_id, by=request.user, reason="from the admin"
            )
            decided += 1
        except DecisionRefused as exc:
            modeladmin.message_user(request, str(exc), messages.WARNING)
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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Run._meta.fields]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Needed for actions; every field stays read-only.
        return request.user.has_perm("chamvi_runs.change_run")

    @admin.action(description="Cancel selected runs", permissions=["change"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        statuses = [api.cancel_run(run.pk) for run in queryset]
        self.message_user(request, f"Cancel requested for {len(statuses)} run(s).", messages.SUCCESS)

    @admin.action(description="Approve the open approval of selected runs", permissions=["approve"])
    def approve_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), True)

    @admin.action(description="Deny the open approval of selected runs", permissions=["approve"])
    def deny_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), False)

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.approve_waitpoint")


@admin.register(WaitPoint)
class WaitPointAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["approval_id", "run", "tool_name", "decision", "expires_at", "notified_at", "created_at"]
    list_filter = ["decision", "tool_name"]
    actions = ["approve", "deny"]
    exclude = ["token_hash"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in WaitPoint._meta.fields if f.name != "token_hash"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("chamvi_runs.approve_waitpoint")

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.approve_waitpoint")

    @admin.action(description="Approve selected", permissions=["approve"])
    def approve(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, True)

    @admin.action(description="Deny selected", permissions=["approve"])
    def deny(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, False)


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["run", "step_index", "finish_reason", "created_at"]
    readonly_fields = ["run", "step_index", "messages", "finish_reason", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at"]
    fields = ["user", "name"]
    readonly_fields: list[str] = []

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_staff

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        token, raw = create_token(obj.user, obj.name)
        obj.pk = token.pk
        self.message_user(
            request, f"API token created. Copy it now, it is not shown again: {raw}", messages.SUCCESS
        )
