"""The two HTML pages: waiting runs to decide, and a chat view of one run. Templates are
``chamvi_runs/approvals.html`` and ``chamvi_runs/run.html``; override them in your project."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from . import api
from .errors import DecisionRefused
from .models import Run, WaitPoint
from .policy import policy


@login_required
@require_http_methods(["GET", "POST"])
def approvals(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action in ("approve", "deny"):
                waitpoint = (
                    WaitPoint.objects.select_related("run")
                    .filter(approval_id=request.POST.get("approval_id", ""))
                    .first()
                )
                if waitpoint is None or not policy().can_decide(request.user, waitpoint.run):
                    raise Http404("no such approval")
                decide = api.approve if action == "approve" else api.deny
                decide(waitpoint.approval_id, by=request.user, reason=request.POST.get("reason", ""))
                messages.success(
                    request, f"{action.title()}d {waitpoint.tool_name} for run {waitpoint.run_id}."
                )
            elif action == "cancel":
                run = Run.objects.filter(pk=request.POST.get("run_id", "")).first()
                if run is None or not policy().can_steer(request.user, run):
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
    return render(request, "chamvi_runs/approvals.html", {"waitpoints": waiting})


@login_required
def run_page(request: HttpRequest, run_id: str) -> HttpResponse:
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not policy().can_view(request.user, run):
        raise Http404("no such run")
    return render(request, "chamvi_runs/run.html", {"run": run, "steps": run.steps.all()})
