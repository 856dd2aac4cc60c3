"""The two HTML pages: waiting runs to decide, and a chat view of one run. Templates are
``chamvi_runs/approvals.html`` and ``chamvi_runs/run.html``; override them in your project."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from . import api
from .core.nul import has_nul
from .errors import DecisionRefused
from .models import Run, WaitPoint
from .policy import policy
from .serializers import StepWindow, error_json, shows_internals, steps_page


def _posted(request: HttpRequest, name: str) -> str:
    """A form field PostgreSQL can look up or store: a NUL in it is a request no page sends (400)."""
    value = request.POST.get(name, "")
    if has_nul(value):
        raise BadRequest(f"{name} must not contain NUL characters")
    return value


@login_required
@require_http_methods(["GET", "POST"])
def approvals(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action in ("approve", "deny"):
                approval_id = _posted(request, "approval_id")
                waitpoint = WaitPoint.objects.select_related("run").filter(approval_id=approval_id).first()
                if waitpoint is None or not policy().can_decide(request.user, waitpoint.run):
                    raise Http404("no such approval")
                decide = api.approve if action == "approve" else api.deny
                decide(waitpoint.approval_id, by=request.user, reason=_posted(request, "reason"))
                messages.success(
                    request, f"{action.title()}d {waitpoint.tool_name} for run {waitpoint.run_id}."
                )
            elif action == "cancel":
                run = Run.objects.filter(pk=_posted(request, "run_id")).first()
                if run is None or not policy().can_cancel(request.user, run):
                    raise Http404("no such run")
                api.cancel_run(run.pk)
                messages.success(request, f"Cancelled run {run.pk}.")
        except DecisionRefused as exc:
            messages.error(request, str(exc))
        return redirect("chamvi_runs:approvals")
    waiting = [
        w
        for w in WaitPoint.objects.select_related("run").filter(decision__isnull=True, run__status="waiting")
        if policy().can_decide(request.user, w.run)
    ]
    cancellable = {w.run_id for w in waiting if policy().can_cancel(request.user, w.run)}
    return render(request, "chamvi_runs/approvals.html", {"waitpoints": waiting, "cancellable": cancellable})


@login_required
def run_page(request: HttpRequest, run_id: str) -> HttpResponse:
    run = None if has_nul(run_id) else Run.objects.filter(pk=run_id).first()
    if run is None or not policy().can_view(request.user, run):
        raise Http404("no such run")
    steps, _ = steps_page(run, StepWindow())
    context = {
        "run": run,
        "steps": steps,
        "error": error_json(run, internals=shows_internals(request.user)),
    }
    return render(request, "chamvi_runs/run.html", context)
