"""What the admin's lists and rows show, and how they stay bounded (``chamvi_runs/admin.py`` registers
them): nothing of them is added, changed or deleted, text PostgreSQL cannot store in a URL matches
nothing, lists leave out heavy columns, a run's inlines show their latest rows, and a step's content
fits on a line, its times to the second."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..agents.agent import registry
from ..core.storable import unstorable
from ..models import Step
from ..streaming.serializers import pretty_json

# Characters of a row's content; the row's own page shows all of it.
SHORT = 200


# Set on a request whose query string held text PostgreSQL cannot store (left out of request.GET).
UNMATCHABLE = "chamvi_unmatchable"


class StorableChangeList(ChangeList):
    """A list whose query string held a NUL or a lone surrogate lists nothing: no row holds one. Its
    rows leave out the admin's ``list_defer``."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        rows = super().get_queryset(request, exclude_parameters)
        if getattr(request, UNMATCHABLE, False):
            return rows.none()
        deferred = getattr(self.model_admin, "list_defer", ())
        return rows.defer(*deferred) if deferred else rows


def _storable(query: QueryDict) -> QueryDict | None:
    """``query`` without its parameters that hold a NUL or a lone surrogate, if it has any."""
    if not unstorable(list(query.lists())):
        return None
    kept = QueryDict(mutable=True)
    for key, values in query.lists():
        if not unstorable([key, values]):
            kept.setlist(key, values)
    return kept


class Storable:
    """Mixed into a ModelAdmin: what a URL or a form sends it with a NUL or a lone surrogate matches
    nothing. An object id is a 404, a list's filter or search lists nothing, a selected id selects
    nothing (an action then says that nothing was selected). A request's GET and POST are replaced
    by storable copies (the stubs type them read-only; HttpRequest allows it)."""

    list_defer: tuple[str, ...] = ()
    """Columns its list leaves out (a run's trigger, a checkpoint's history)."""

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if unstorable(object_id):
            raise Http404("no such object")
        return super().get_object(request, object_id, from_field)  # type: ignore[misc]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return StorableChangeList

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # Such a parameter fails the query (a 500), and its links, which a lone surrogate cannot
        # be encoded in: the list goes on without it, empty.
        kept = _storable(request.GET)
        if kept is not None:
            request.GET = kept  # type: ignore[assignment]
            setattr(request, UNMATCHABLE, True)
        changelist: ChangeList = super().get_changelist_instance(request)  # type: ignore[misc]
        return changelist

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], term: str) -> Any:
        if unstorable(term):
            return queryset.none(), False
        return super().get_search_results(request, queryset, term)  # type: ignore[misc]

    def response_action(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse | None:
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        if unstorable(selected):
            storable = request.POST.copy()
            storable.setlist(ACTION_CHECKBOX_NAME, [pk for pk in selected if not unstorable(pk)])
            request.POST = storable  # type: ignore[assignment]
        response: HttpResponse | None = super().response_action(request, *args, **kwargs)  # type: ignore[misc]
        return response


class ReadOnly:
    """Whatever permissions a staff user holds: no add, no change form save, no delete (which also
    removes the "delete selected" action)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def second(value: datetime | None) -> str:
    """A time to the second, in the site's time zone (the admin's own show minutes)."""
    return formats.date_format(timezone.localtime(value), "Y-m-d H:i:s") if value else "-"


def duration(started: datetime | None, finished: datetime | None) -> str:
    """How long from ``started`` to ``finished``, to the millisecond."""
    if started is None or finished is None:
        return "-"
    ms = round((finished - started).total_seconds() * 1000)
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.3f} s"


def short(text: str) -> str:
    """``text`` on one line, cut at ``SHORT`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= SHORT else line[: SHORT - 1] + "…"


def step_content(step: Step) -> str:
    """What a step holds: the model's text and the calls it asked for; a tool's arguments and its
    result or error; the call that waits for approval."""
    if step.kind == Step.Kind.LLM:
        output = step.output or {}
        calls = [(c.get("function") or {}).get("name", "?") for c in output.get("tool_calls") or []]
        parts = [output.get("text") or output.get("reasoning") or "", *(f"→ {name}()" for name in calls)]
    elif step.kind == Step.Kind.TOOL:
        result = f"error: {step.error}" if step.error else pretty_json(step.output)
        return f"{pretty_json(step.input)} → {result}"
    else:
        parts = [f"approval of {step.name}: {pretty_json(step.input)}"]
    return " ".join(p for p in [*parts, f"error: {step.error}" if step.error else ""] if p)


def run_link(run_id: str) -> SafeString:
    """The run's admin page, from its id alone: no join with the run's row."""
    url = reverse("admin:chamvi_runs_run_change", args=[quote(run_id)])
    return format_html('<a href="{}">{}</a>', url, run_id)


class StepColumns:
    """A step's columns, in a run's inline and in the step list: its content shortened (its own
    page shows it whole), its start to the second, how long it took to the millisecond."""

    @admin.display(description="content")
    def content(self, step: Step) -> str:
        return short(step_content(step))

    @admin.display(description="started", ordering="started_at")
    def started(self, step: Step) -> str:
        return second(step.started_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, step: Step) -> str:
        return second(step.finished_at)

    @admin.display(description="took")
    def took(self, step: Step) -> str:
        return duration(step.started_at, step.finished_at)

    @admin.display(description="run", ordering="run_id")
    def run_link(self, step: Step) -> SafeString:
        return run_link(step.run_id)

    @admin.display(description="input")
    def input_json(self, step: Step) -> SafeString:
        return format_html("<pre>{}</pre>", pretty_json(step.input))

    @admin.display(description="output")
    def output_json(self, step: Step) -> SafeString:
        return format_html("<pre>{}</pre>", pretty_json(step.output))


class LatestRows(BaseInlineFormSet):
    """The latest ``LIMIT`` rows of a read-only inline (a run may have 10,000 steps), in the
    inline's ``ordering``, oldest first; the template ``chamvi_runs/admin/latest_rows.html`` says
    how many there are in all and links to the list of all of them (``?run=<id>``)."""

    LIMIT = 50

    def get_queryset(self) -> Any:
        if not hasattr(self, "latest"):
            rows = super().get_queryset()
            self.latest = list(rows.reverse()[: self.LIMIT])[::-1]
            self.total = len(self.latest) if len(self.latest) < self.LIMIT else rows.count()
            changelist = reverse(f"admin:chamvi_runs_{rows.model._meta.model_name}_changelist")
            self.all_url = f"{changelist}?{urlencode({'run': self.instance.pk})}"
        return self.latest


class AgentFilter(admin.SimpleListFilter):
    """The agents this process registered: a filter of the distinct values in the table reads all
    of it on every page. Runs of an agent no longer registered are listed by ``?agent=<name>``."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(agent=self.value()) if self.value() else queryset


class VersionFilter(admin.SimpleListFilter):
    """The versions this process's agents have now (SPEC §14), as AgentFilter lists agents: runs of
    an older version are listed by ``?agent_version=<version>``."""

    title = "agent version"
    parameter_name = "agent_version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (registry.get(name).version, f"{name} {registry.get(name).version}") for name in registry.names()
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(agent_version=self.value()) if self.value() else queryset
