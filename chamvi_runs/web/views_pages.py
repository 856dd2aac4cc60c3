"""The HTML pages: waiting runs to decide, a chat view of one run, and of one thread. Templates are
``chamvi_runs/approvals.html``, ``chamvi_runs/run.html`` and ``chamvi_runs/thread.html`` (with
``chamvi_runs/thread_run.html`` for one run of a thread, ``chamvi_runs/question.html`` for a
question the run asks its user, ``chamvi_runs/decision.html`` for a decision); override them in
your project. The pages' scripts (``run-page.js``, ``thread-page.js``, ``approvals-page.js``) are
modules on the client ``client.js`` and get what they need from the ``chamvi-page`` JSON block: no
inline script."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest
from django.core.paginator import Paginator
from django.db.models import F, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from .. import api
from ..core.branches import current_branch
from ..core.states import TERMINAL, Status
from ..core.storable import WHAT, unstorable
from ..models import Run, Step, Thread, WaitPoint
from ..policy import can_answer, decidable_approvals, policy
from ..store import queries
from ..streaming.serializers import error_json, shows_internals
from . import threads
from .approvals import decide
from .errors import ApiError
from .lineage import (
    THREAD_RUNS,
    branch_of,
    in_order,
    lineage_notes,
    may_again,
    off_branch,
    replaced_by,
    trigger_payloads,
)
from .wait_display import canonical, compact, decision_row, open_wait

# How many of a run's latest steps its summary on a thread page carries.
SUMMARY_STEPS = 100
# The mark after a model's answer that ended before its end, by the finish reason its llm step
# stored (None: the stream was cut before one came). render.js marks the live conversation alike.
STOPPED: dict[str | None, str] = {
    "length": "— cut off: the answer reached the model's length limit",
    "content_filter": "— cut off by the provider's content filter",
    "error": "— stopped: the model call failed",
    None: "— cut off: the model's answer stopped before its end",
}
# Open approvals on one page of the approvals page.
APPROVALS_PER_PAGE = 50
# What the approvals page reads of an approval and its run (and its creator's name): a policy that
# reads more of the run loads it for each of the page's rows.
APPROVAL_COLUMNS: tuple[str, ...] = ("approval_id", "run", "tool_name", "input", "expires_at", "created_at")
APPROVAL_COLUMNS += ("editable", "run__agent", "run__status", "run__created_by", "run__parent")


def _open_waits(run: Run) -> list[dict[str, Any]]:
    """The run's open wait points, in the order of its model call's calls: the questions of one
    model call wait together."""
    if run.status != Status.WAITING:
        return []
    opened = run.waitpoints.filter(decision__isnull=True).order_by("model_step", "call_position", "pk")
    # A child run's wait is decided by the child, not on this page.
    return [open_wait(w) for w in opened.exclude(kind=WaitPoint.Kind.CHILD)]


def _posted(request: HttpRequest, name: str) -> str:
    """A form field PostgreSQL can look up or store: a NUL or a lone surrogate in it is a
    request no page sends (400)."""
    value = request.POST.get(name, "")
    if unstorable(value):
        raise BadRequest(f"{name} must not contain {WHAT}")
    return value


def _edited(request: HttpRequest, approval_id: str) -> tuple[bool, Any]:
    """Whether the approval form's ``arguments`` (the proposal as JSON, which the approver may have
    changed) differ from the proposal, and what they are then. Text that is not JSON is said on the
    page (``ValueError``)."""
    posted = _posted(request, "arguments")
    if not posted.strip():
        return False, None
    try:
        arguments = json.loads(posted)
    except ValueError as exc:
        raise ValueError(f"The arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError("The arguments must be a JSON object, as the model proposed them.")
    proposed = WaitPoint.objects.filter(approval_id=approval_id).values_list("input", flat=True).first()
    return canonical(arguments) != canonical(proposed), arguments


def _decide(request: HttpRequest, approve: bool) -> None:
    """Decide the posted approval, with the arguments as the approver edited them, if they did. One
    the user may not decide is a 404, as one that does not exist; a malformed field is a request no
    page sends (400); a refusal (decided already, expired, edited arguments that do not fit the
    tool) is said on the page."""
    approval_id = _posted(request, "approval_id")
    edit: dict[str, Any] = {}
    if approve and "arguments" in request.POST:
        try:
            edited, arguments = _edited(request, approval_id)
        except ValueError as exc:
            messages.error(request, str(exc))
            return
        if edited:
            edit["arguments"] = arguments
    try:
        waitpoint = decide(request.user, approval_id, approve, reason=request.POST.get("reason", ""), **edit)
    except ApiError as exc:
        if exc.code in ("invalid_arguments", "not_editable"):
            messages.error(request, exc.message)
            return
        if exc.status == 400:
            raise BadRequest(exc.message) from None
        if exc.code in ("not_found", "forbidden"):
            raise Http404("no such approval") from None
        messages.error(request, exc.message)
        return
    verb = "Approved" if approve else "Denied"
    changes = " with your changes" if edit else ""
    messages.success(request, f"{verb} {waitpoint.tool_name} for run {waitpoint.run_id}{changes}.")


@login_required
@require_http_methods(["GET", "POST"])
def approvals(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        action = request.POST.get("action")
        if action in ("approve", "deny"):
            _decide(request, action == "approve")
        elif action == "cancel":
            run = Run.objects.filter(pk=_posted(request, "run_id")).first()
            if run is None or not policy().can_cancel(request.user, run):
                raise Http404("no such run")
            open_approval = run.waitpoints.filter(decision__isnull=True, kind=WaitPoint.Kind.APPROVAL)
            tool = open_approval.values_list("tool_name", flat=True).first()
            status = api.cancel_run(run.pk, by=request.user)
            if status != Status.CANCELLED:
                messages.success(request, f"Cancel requested for run {run.pk}; it is {status}.")
            elif tool:
                messages.success(request, f"Cancelled run {run.pk}; its approval of {tool} is cancelled.")
            else:
                messages.success(request, f"Cancelled run {run.pk}.")
        # Back to the page the form was on (its ?page=).
        return redirect(request.get_full_path())
    return render(request, "chamvi_runs/approvals.html", _approvals_context(request))


def _open_approvals() -> QuerySet[WaitPoint]:
    """Open approvals of waiting runs, soonest expiry first (those that need a decision first; none
    without an expiry last), with only the columns the page shows: never a run's trigger or output.
    Questions are not approvals: the run's user answers them on the run's page."""
    creator = f"run__created_by__{get_user_model().USERNAME_FIELD}"
    return (
        WaitPoint.objects.filter(
            decision__isnull=True, run__status=Status.WAITING, kind=WaitPoint.Kind.APPROVAL
        )
        .select_related("run", "run__created_by")
        .only(*APPROVAL_COLUMNS, creator)
        .order_by(F("expires_at").asc(nulls_last=True), "created_at", "pk")
    )


def _approvals_context(request: HttpRequest) -> dict[str, Any]:
    """One page of the open approvals the user may decide. The policy's ``decidable`` filters them
    in the query; a policy without one is asked ``can_decide`` for each row of a page of all of them
    (``filtered``: a page may then show fewer rows, and its count is not the user's)."""
    user, opened = request.user, _open_approvals()
    decidable = decidable_approvals(user, opened)
    paginator = Paginator(opened if decidable is None else decidable, APPROVALS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    rows = list(page.object_list)
    if decidable is None:
        rows = [w for w in rows if policy().can_decide(user, w.run)]
    return {
        "waitpoints": rows,
        "listing": page,
        "filtered": decidable is None,
        # The policy said "none of them" outright (DefaultPolicy without the permission).
        "may_decide_none": decidable is not None and decidable.query.is_empty(),
        "cancellable": {w.run_id for w in rows if policy().can_cancel(user, w.run)},
        "page": {"base": client_base()},
    }


def client_base() -> str:
    """Where the site included ``chamvi_runs.urls``: the ``base`` of the pages' client (client.js)."""
    return reverse("chamvi_runs:approvals").removesuffix("approvals/")


def _viewable(user: Any, thread: Thread | None) -> Thread | None:
    return thread if thread is not None and policy().can_view_thread(user, thread) else None


def _summary(run: Run) -> dict[str, Any]:
    """One run of a thread as its page shows it before (or without) the live stream: its trigger,
    the conversation of its latest steps, its status and output."""
    steps = list(run.steps.order_by("-index")[:SUMMARY_STEPS])[::-1]
    payloads = queries.taken_inputs(run, steps)
    items: list[dict[str, Any]] = []
    for step in steps:
        if step.kind == Step.Kind.LLM:
            output = step.output or {}
            for input_id in (step.input or {}).get("inputs") or []:
                if input_id in payloads:
                    items.append({"kind": "input", "payload": payloads[input_id]})
            text, reasoning = output.get("text") or "", output.get("reasoning") or ""
            stopped = STOPPED.get(output.get("finish_reason", ""), "")
            items.append({"kind": "step", "text": text, "reasoning": reasoning, "stopped": stopped})
        elif step.kind == Step.Kind.TOOL:
            items.append({"kind": "tool-call", "name": step.name, "value": step.input})
            items.append(
                {"kind": "tool-result", "name": step.name, "value": step.output, "error": step.error or None}
            )
    payload = (run.trigger or {}).get("payload")
    return {
        "run": run,
        "message": payload,
        # What the thread page's "Edit" starts from (render.js ``editableMessage``).
        "payload_json": compact(payload),
        "items": items,
        "error": error_json(run, internals=False),
        # A text output is the last step's text, already in the conversation.
        "structured_output": None if isinstance(run.output, str) else run.output,
        "waits": _open_waits(run),
    }


def _thread_runs(user: Any, runs: Any, *, actions: bool = False) -> list[dict[str, Any]]:
    """The summaries of the runs ``user`` may view; with ``actions``, each says whether the user may
    answer it again (Regenerate) or edit its message (Edit): the thread page's buttons."""
    runs = list(runs)
    replaced = trigger_payloads({run.replaces_id for run in runs if run.replaces_id})
    shown = []
    for run in runs:
        if policy().can_view(user, run):
            summary = _summary(run)
            # The thread page's script asks it of the run's later questions too.
            summary["can_answer"] = can_answer(user, run)
            summary["again"] = actions and may_again(user, run)
            summary["lineage"] = lineage_notes(run, replaced)
            shown.append(summary)
    return shown


@login_required
def run_page(request: HttpRequest, run_id: str) -> HttpResponse:
    run = None if unstorable(run_id) else Run.objects.select_related("created_by").filter(pk=run_id).first()
    user = request.user
    if run is None or not policy().can_view(user, run):
        raise Http404("no such run")
    active = run.status not in TERMINAL
    can_decide = bool(policy().can_decide(user, run))
    answers = can_answer(user, run)
    thread = _viewable(user, threads.find(user, run.thread, run.scope)) if run.thread else None
    history: list[dict[str, Any]] = []
    on_branch = True
    if thread is not None:
        # The runs this one goes on from: not those a regenerate or an edit left behind.
        earlier, on_branch = branch_of(run)
        history = _thread_runs(user, in_order(earlier[-THREAD_RUNS:]))
    context = {
        "run": run,
        "error": error_json(run, internals=shows_internals(user)),
        "waits": _open_waits(run),
        "can_decide": can_decide,
        "can_answer": answers,
        "decisions": [decision_row(w) for w in queries.decided_waitpoints(run)],
        "can_steer": active and policy().can_steer(user, run),
        "can_cancel": active and policy().can_cancel(user, run),
        "thread": thread,
        "thread_query": threads.query_of(thread, user) if thread is not None else "",
        "history": history,
        "lineage": lineage_notes(run),
        "replaced_by": replaced_by(run),
        "off_branch": thread is not None and not on_branch,
        "page": {
            "base": client_base(),
            "run_id": run.pk,
            "status": run.status,
            "can_decide": can_decide,
            "can_answer": answers,
        },
    }
    return render(request, "chamvi_runs/run.html", context)


@login_required
def thread_page(request: HttpRequest, thread: str) -> HttpResponse:
    """The thread ``thread`` means for the user (``web.threads``), or in ``?scope=``."""
    found = _viewable(request.user, threads.find(request.user, thread, request.GET.get("scope")))
    if found is None:
        raise Http404("no such thread")
    # The thread's current branch (core.branches): runs a regenerate or an edit left behind are
    # listed apart, as links (the page's script shows them in place on demand).
    nodes = queries.thread_nodes(found.name, found.scope)
    branch = current_branch(nodes)
    shown = branch[-THREAD_RUNS:]
    summaries = _thread_runs(request.user, in_order(shown), actions=True)
    latest = Run.objects.filter(pk=nodes[-1].id).first() if nodes else None
    context = {
        "thread": found,
        "runs": summaries,
        "replaced": off_branch(request.user, nodes, branch),
        # Edit and Regenerate wait while a run of the thread is active (the page's script follows).
        "busy": Run.objects.filter(scope=found.scope, thread=found.name)
        .exclude(status__in=TERMINAL)
        .exists(),
        "page": {
            "base": client_base(),
            "thread": found.name,
            "scope": found.scope,
            # Every run of the thread the page knows, oldest first: where a run the page is shown
            # later (a replaced one, on demand) goes among the others.
            "order": [n.id for n in nodes][-2 * THREAD_RUNS :],
            "branch": shown,
            # Whether runs started while the page is open get Edit and Regenerate: as the thread's
            # latest run does (the server refuses what the viewer may not do anyway).
            "may_again": may_again(request.user, latest) if latest is not None else True,
        },
    }
    return render(request, "chamvi_runs/thread.html", context)
