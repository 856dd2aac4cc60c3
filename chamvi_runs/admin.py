"""A read-only admin: runs change only through actions, which call the same API as everything else.

Nothing of run state is added, changed or deleted here: a change form's save is a full-row UPDATE of
status, claim and attempt with values read a moment earlier (no fence), and deleting a live run's
checkpoint silently restarts it from its trigger. Each action has its own permission.

Every list is paged and reads only what it shows (``chamvi_runs/web/admin_lists.py``): no list
counts its whole table, a run's page shows its latest steps and wait points and links to all of
them, and a NUL or a lone surrogate in a URL matches nothing instead of failing the query."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.debug import sensitive_variables

from . import api
from .models import ApiToken, Checkpoint, Run, Step, StuckRun, WaitPoint, WorkerVersion
from .streaming.serializers import pretty_json, question
from .web.admin_lists import (
    AgentFilter,
    LatestRows,
    ReadOnly,
    StepColumns,
    Storable,
    VersionFilter,
    run_link,
    second,
    short,
)
from .web.admin_stuck import StuckRunAdmin as StuckRunAdmin  # public here: docs/public-api.md
from .web.admin_stuck import WorkerVersionAdmin
from .web.approvals import decide
from .web.auth import create_token
from .web.errors import ApiError
from .web.wait_display import answer_text, argument_changes

# A run's place in its thread on its admin page, and how many of the runs replacing it are linked.
LINEAGE_FIELDS = ("replaces_run", "replaced_by_runs", "forked_from_run")
LINEAGE_LINKS = 20
STEP_FIELDS = ("index", "kind", "name", "content", "attempt", "started", "took")
STEP_PAGE_FIELDS: tuple[str, ...] = (
    "run_link",
    "index",
    "kind",
    "name",
    "attempt",
    "started",
    "finished",
    "took",
)
STEP_PAGE_FIELDS += ("input_json", "output_json", "error")
WAITPOINT_FIELDS: tuple[str, ...] = ("approval_id", "kind", "tool_name", "question_text", "arguments")
WAITPOINT_FIELDS += ("what_changed", "answer_shown")
WAITPOINT_FIELDS += ("expires", "decision", "decided_by", "decided")


class WaitPointColumns:
    """What a wait point asked and what became of it, in a run's inline and on its own page: a
    question's text and answer, an approval's arguments as an approver changed them."""

    @admin.display(description="question")
    def question_text(self, waitpoint: WaitPoint) -> str:
        return question(waitpoint) or "-"

    @admin.display(description="answer")
    def answer_shown(self, waitpoint: WaitPoint) -> str:
        if waitpoint.decision != WaitPoint.Decision.ANSWERED:
            return "-"
        return short(answer_text(waitpoint.answer))

    @admin.display(description="what changed")
    def what_changed(self, waitpoint: WaitPoint) -> str:
        """The approved arguments against the model's proposal, key by key: "amount_cents 4599 → 2000"."""
        changes = argument_changes(waitpoint.input, waitpoint.approved_input)
        if not changes:
            return "-"
        return short("; ".join(f"{c['key']} {c['before']} → {c['after']}".strip() for c in changes))


def _refused_questions(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, waitpoints: QuerySet[WaitPoint]
) -> QuerySet[WaitPoint]:
    """The approvals among ``waitpoints``; each question among them is said and left alone: the run's
    user answers it, nobody approves it."""
    questions = waitpoints.filter(kind=WaitPoint.Kind.INPUT)
    for approval_id, tool_name in questions.values_list("approval_id", "tool_name"):
        modeladmin.message_user(
            request,
            f"Left open: {approval_id} is a question ({tool_name}), not an approval; the run's user "
            "answers it on the run's page.",
            messages.WARNING,
        )
    return waitpoints.filter(kind=WaitPoint.Kind.APPROVAL)


class StepInline(StepColumns, ReadOnly, admin.TabularInline):
    model = Step
    formset = LatestRows
    template = "chamvi_runs/admin/latest_rows.html"
    ordering = ["index"]
    extra = 0
    fields = readonly_fields = STEP_FIELDS
    # The step's own page shows its content whole.
    show_change_link = True


class WaitPointInline(WaitPointColumns, ReadOnly, admin.TabularInline):
    model = WaitPoint
    fk_name = "run"
    formset = LatestRows
    template = "chamvi_runs/admin/latest_rows.html"
    ordering = ["created_at", "pk"]
    extra = 0
    fields = readonly_fields = (*WAITPOINT_FIELDS, "reason")
    show_change_link = True

    @admin.display(description="input")
    def arguments(self, waitpoint: WaitPoint) -> str:
        return short(pretty_json(waitpoint.input))

    @admin.display(description="expires at")
    def expires(self, waitpoint: WaitPoint) -> str:
        return second(waitpoint.expires_at)

    @admin.display(description="decided at")
    def decided(self, waitpoint: WaitPoint) -> str:
        return second(waitpoint.decided_at)


def _may_approve(user: Any, run: Run | None = None) -> bool:
    """The admin's actions decide with this permission, whatever the site's policy (which the pages,
    the API and the websocket ask) says."""
    return bool(user.has_perm("chamvi_runs.approve_waitpoint"))


def _decide(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, waitpoints: QuerySet[WaitPoint], approve: bool
) -> None:
    decided = 0
    approvals = _refused_questions(modeladmin, request, waitpoints)
    for approval_id in approvals.values_list("approval_id", flat=True):
        try:
            decide(request.user, approval_id, approve, reason="from the admin", may_decide=_may_approve)
            decided += 1
        except ApiError as exc:
            modeladmin.message_user(request, exc.message, messages.WARNING)
    if decided:
        verb = "Approved" if approve else "Denied"
        modeladmin.message_user(request, f"{verb} {decided} approval(s).", messages.SUCCESS)


@admin.register(Run)
class RunAdmin(Storable, ReadOnly, admin.ModelAdmin):
    list_display = [
        "id",
        "agent",
        "agent_version",
        "status",
        "thread",
        "model_calls",
        "input_tokens",
        "output_tokens",
        "created_at",
    ]
    # Dates by range (today, the past 7 days, ...): a date hierarchy reads the distinct days of the
    # whole table on every page.
    list_filter = ["status", AgentFilter, VersionFilter, "created_at"]
    list_defer = ("trigger", "output", "error_message", "listed_tools")
    # "N total" would count the whole table on every page.
    show_full_result_count = False
    search_fields = ["id", "thread", "concurrency_key", "trigger_id"]
    inlines = [StepInline, WaitPointInline]
    actions = ["cancel_runs", "approve_open", "deny_open"]
    # Where the run stands in its thread (SPEC §12), as links to the runs, after its thread.
    exclude = ("base", "base_step", "replaces")
    readonly_fields = LINEAGE_FIELDS

    def get_fields(self, request: HttpRequest, obj: Run | None = None) -> list[Any]:
        fields: list[Any] = [f for f in super().get_fields(request, obj) if f not in LINEAGE_FIELDS]
        at = fields.index("thread") + 1 if "thread" in fields else len(fields)
        return [*fields[:at], *LINEAGE_FIELDS, *fields[at:]]

    @admin.display(description="replaces")
    def replaces_run(self, run: Run) -> SafeString | str:
        """The run this one regenerates or resends (its message edited)."""
        return run_link(run.replaces_id) if run.replaces_id else "-"

    @admin.display(description="replaced by")
    def replaced_by_runs(self, run: Run) -> SafeString | str:
        """The runs that regenerate or resend this one, newest first."""
        newer = Run.objects.filter(replaces_id=run.pk).order_by("-created_at", "-id")
        ids = list(newer.values_list("pk", flat=True)[: LINEAGE_LINKS + 1])
        if not ids:
            return "-"
        links = format_html_join(", ", "{}", ((run_link(pk),) for pk in ids[:LINEAGE_LINKS]))
        return format_html("{}{}", links, ", …" if len(ids) > LINEAGE_LINKS else "")

    @admin.display(description="forked from")
    def forked_from_run(self, run: Run) -> SafeString | str:
        """The run and step a fork (``from_step``) started from; a regenerate's base is the run it
        replaces, said above."""
        if not run.base_id or run.replaces_id:
            return "-"
        step = "its start" if run.base_step is None or run.base_step < 0 else f"step {run.base_step}"
        return format_html("{} at {}", run_link(run.base_id), step)

    def view_on_site(self, obj: Run) -> str:
        """The run's chat page: its conversation, decisions and live events."""
        return obj.get_absolute_url()

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chamvi_runs.cancel_run")

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        # Ids only: "select all" may cover every run, with its trigger.
        statuses = [api.cancel_run(pk, by=request.user) for pk in queryset.values_list("pk", flat=True)]
        self.message_user(request, f"Cancel requested for {len(statuses)} run(s).", messages.SUCCESS)

    @admin.action(description="Approve the open approval of selected runs", permissions=["approve"])
    def approve_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), True)

    @admin.action(description="Deny the open approval of selected runs", permissions=["approve"])
    def deny_open(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _decide(self, request, WaitPoint.objects.filter(run__in=queryset, decision__isnull=True), False)

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return _may_approve(request.user)


admin.site.register(StuckRun, StuckRunAdmin)
admin.site.register(WorkerVersion, WorkerVersionAdmin)


@admin.register(WaitPoint)
class WaitPointAdmin(WaitPointColumns, Storable, ReadOnly, admin.ModelAdmin):
    # The run's id: the run itself would join each row with the run's trigger.
    list_display = [
        "approval_id",
        "run_id_link",
        "kind",
        "tool_name",
        "decision",
        "expires_at",
        "notified_at",
        "created_at",
    ]
    # Tool names are searched: a filter of them reads every wait point for its distinct values.
    list_filter = ["kind", "decision"]
    search_fields = ["approval_id", "tool_name"]
    list_defer = ("input", "reason", "approved_input", "answer", "answer_schema")
    show_full_result_count = False
    actions = ["approve", "deny"]
    exclude = ["token_hash"]
    readonly_fields = ["question_text", "what_changed"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The model's fields, with a question's text after the tool's name and what an approver
        changed after the approved arguments."""
        fields = [f for f in super().get_fields(request, obj) if f not in self.readonly_fields]
        for field, after in (("question_text", "tool_name"), ("what_changed", "approved_input")):
            fields.insert(fields.index(after) + 1 if after in fields else len(fields), field)
        return fields

    @admin.display(description="run", ordering="run_id")
    def run_id_link(self, waitpoint: WaitPoint) -> SafeString:
        return run_link(waitpoint.run_id)

    def view_on_site(self, obj: WaitPoint) -> str:
        return obj.run.get_absolute_url()

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return _may_approve(request.user)

    @admin.action(description="Approve selected (not questions)", permissions=["approve"])
    def approve(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, True)

    @admin.action(description="Deny selected (not questions)", permissions=["approve"])
    def deny(self, request: HttpRequest, queryset: QuerySet[WaitPoint]) -> None:
        _decide(self, request, queryset, False)


@admin.register(Checkpoint)
class CheckpointAdmin(Storable, ReadOnly, admin.ModelAdmin):
    list_display = ["run_id_link", "step_index", "finish_reason", "created_at"]
    # A checkpoint's JSON is history (a thread's, a run's whole one): none of it is listed.
    list_defer = tuple(f.name for f in Checkpoint._meta.concrete_fields if isinstance(f, models.JSONField))
    show_full_result_count = False

    @admin.display(description="run", ordering="run_id")
    def run_id_link(self, checkpoint: Checkpoint) -> SafeString:
        return run_link(checkpoint.run_id)


@admin.register(Step)
class StepAdmin(StepColumns, Storable, ReadOnly, admin.ModelAdmin):
    """The steps of a run (``?run=<id>``, linked from the run's page) a page at a time, and one
    step whole. Not on the admin's index: a run is where to start."""

    list_display = ["index", "kind", "name", "content", "attempt", "started", "took", "run_link"]
    list_filter = ["kind"]
    ordering = ["run", "index"]
    show_full_result_count = False
    fields = readonly_fields = STEP_PAGE_FIELDS

    def has_module_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(Storable, admin.ModelAdmin):
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
