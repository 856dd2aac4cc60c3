"""Runs, steps and wait points as the JSON the HTTP API and pages return.

What a viewer sees depends on who they are: staff see the execution's internals (the worker that
holds the claim, the text of an internal error); every other viewer sees stable codes only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..models import Run, Step, WaitPoint
from ..store import queries
from . import events

INTERNAL_ERROR = "internal_error"
INTERNAL_ERROR_MESSAGE = "the run stopped on an internal error; the site's operators have the details"
STEPS_LIMIT = 100
MAX_STEPS_LIMIT = 1000


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def shows_internals(viewer: Any) -> bool:
    """Whether ``viewer`` may see hostnames, process ids and exception text of executions."""
    return bool(viewer is not None and viewer.is_active and viewer.is_staff)


def error_json(run: Run, *, internals: bool) -> dict[str, str] | None:
    """The run's ``{code, message}``. An internal error's message may hold exception text (paths,
    SQL, settings): only staff read it, the others get a fixed sentence."""
    error = run.error
    if error is not None and error["code"] == INTERNAL_ERROR and not internals:
        return {"code": INTERNAL_ERROR, "message": INTERNAL_ERROR_MESSAGE}
    return error


@dataclass(frozen=True)
class StepWindow:
    """Which steps a run's JSON carries: with ``after``, the first ``limit`` steps whose index is
    above it; otherwise the last ``limit`` steps below ``before`` (the latest, without either)."""

    after: int | None = None
    before: int | None = None
    limit: int = STEPS_LIMIT


def step_json(step: Step) -> dict[str, Any]:
    return {
        "index": step.index,
        "kind": step.kind,
        "name": step.name,
        "input": step.input,
        "output": step.output,
        "error": step.error or None,
        "attempt": step.attempt,
        "started_at": _iso(step.started_at),
        "finished_at": _iso(step.finished_at),
    }


def steps_page(run: Run, window: StepWindow) -> tuple[list[Step], dict[str, Any]]:
    """One window of the run's steps in index order, and ``{limit, total, earlier, later}``: whether
    steps exist before and after the window, for the next request."""
    steps = run.steps.all()
    if window.after is not None:
        steps = steps.filter(index__gt=window.after)
    if window.before is not None:
        steps = steps.filter(index__lt=window.before)
    if window.after is not None:
        page = list(steps.order_by("index")[: window.limit])
    else:
        page = list(steps.order_by("-index")[: window.limit])[::-1]
    # An empty window still tells where steps are: below its lower bound, above its upper one.
    lower = page[0].index if page else (None if window.after is None else window.after + 1)
    upper = page[-1].index if page else (None if window.before is None else window.before - 1)
    return page, {
        "limit": window.limit,
        "total": run.steps.count(),
        "earlier": lower is not None and run.steps.filter(index__lt=lower).exists(),
        "later": upper is not None and run.steps.filter(index__gt=upper).exists(),
    }


def question(waitpoint: WaitPoint) -> str | None:
    """What a question asks, as the model put it (None for an approval, or a client tool asked
    nothing)."""
    if waitpoint.kind != WaitPoint.Kind.INPUT or not isinstance(waitpoint.input, dict):
        return None
    text = waitpoint.input.get("question")
    return text if isinstance(text, str) and text else None


def waiting_event(waitpoint: WaitPoint) -> dict[str, Any]:
    """The fields of the ``run.waiting`` that announces an open wait point (``events.run_waiting``),
    which the wait point's JSON opens with too."""
    return {
        "approval_id": waitpoint.approval_id,
        "kind": waitpoint.kind,
        "tool_name": waitpoint.tool_name,
        "tool_call_id": waitpoint.tool_call_id,
        "input": waitpoint.input,
        "question": question(waitpoint),
        "answer_schema": waitpoint.answer_schema,
        "client": waitpoint.client,
        "editable": waitpoint.editable and waitpoint.kind == WaitPoint.Kind.APPROVAL,
        "expires_at": _iso(waitpoint.expires_at),
    }


def waitpoint_json(waitpoint: WaitPoint | None) -> dict[str, Any] | None:
    if waitpoint is None:
        return None
    return {
        "run_id": waitpoint.run_id,
        **waiting_event(waitpoint),
        "approved_input": waitpoint.approved_input,
        "answer": waitpoint.answer,
        "notified_at": _iso(waitpoint.notified_at),
        "decision": waitpoint.decision,
        "decided_by": waitpoint.decided_by_id,
        "decided_at": _iso(waitpoint.decided_at),
        "reason": waitpoint.reason,
        "created_at": _iso(waitpoint.created_at),
    }


def decision_json(waitpoint: WaitPoint) -> dict[str, Any]:
    """A decided wait point as the pages and ``run.resume`` show it: what was decided, by whom."""
    decided_by = waitpoint.decided_by
    return {
        "approval_id": waitpoint.approval_id,
        "kind": waitpoint.kind,
        "tool_name": waitpoint.tool_name,
        "input": waitpoint.input,
        "approved_input": waitpoint.approved_input,
        "answer": waitpoint.answer,
        "decision": waitpoint.decision,
        "decided_by": decided_by.get_username() if decided_by is not None else None,
        "decided_at": _iso(waitpoint.decided_at),
        "reason": waitpoint.reason,
    }


def decisions_json(run: Run) -> list[dict[str, Any]]:
    """Every decided wait point of the run, oldest first."""
    return [decision_json(w) for w in queries.decided_waitpoints(run)]


def pretty_json(value: Any) -> str:
    """The one readable rendering of payloads, inputs and outputs on the pages (the pages' script
    does the same with ``JSON.stringify(value, null, 2)``). Not escaped: templates escape it."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def run_json(run: Run, *, viewer: Any, window: StepWindow | None = None) -> dict[str, Any]:
    """The run as ``viewer`` may see it, with one window of its steps (the latest by default)."""
    internals = shows_internals(viewer)
    data: dict[str, Any] = {
        "id": run.id,
        "agent": run.agent,
        "agent_version": run.agent_version,
        "status": run.status,
        "trigger": run.trigger,
        "concurrency_key": run.concurrency_key,
        "thread": run.thread,
        "output": run.output,
        "error": error_json(run, internals=internals),
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "model_calls": run.model_calls,
        "claim_expires_at": _iso(run.claim_expires_at),
        "cancel_requested": run.cancel_requested,
        "created_by": run.created_by_id,
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        **lineage(run),
        **family(run),
    }
    if internals:
        # hostname:pid of the worker holding the claim: a map of the site's machines.
        data["claim_owner"] = run.claim_owner
    steps, page = steps_page(run, window or StepWindow())
    data["steps"] = [step_json(s) for s in steps]
    data["steps_page"] = page
    # Every open wait point (questions of one model call wait together); ``waiting``: the first.
    waits = [
        waitpoint_json(w) for w in run.waitpoints.filter(decision__isnull=True).order_by("call_position")
    ]
    data["waiting"] = waits[0] if waits else None
    data["waits"] = waits
    data["inputs"] = list(run.inputs.exclude(consumed_step=None).values_list("id", flat=True))
    data["decisions"] = decisions_json(run)
    return data


def branch_run_json(run: Run) -> dict[str, Any]:
    """A run as a thread's JSON lists it: what was asked, what came of it, and its lineage."""
    return {
        "id": run.pk,
        "agent": run.agent,
        "status": run.status,
        "payload": run.trigger.get("payload"),
        "output": run.output,
        "error": error_json(run, internals=False),
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
        **lineage(run),
    }


def family(run: Run) -> dict[str, Any]:
    """Delegation (SPEC §13): the call of the parent run that started this one (``parent``), and the
    child runs this one started, by the call that started each, with their statuses."""
    children = Run.objects.filter(parent_id=run.pk).order_by("parent_step", "parent_position")
    return {
        "parent": parent_call(run),
        "children": [
            {
                "id": child.pk,
                "agent": child.agent,
                "status": child.status,
                "step": child.parent_step,
                "position": child.parent_position,
                "usage": {"input_tokens": child.input_tokens, "output_tokens": child.output_tokens},
            }
            for child in children.only(
                "agent", "status", "parent_step", "parent_position", "input_tokens", "output_tokens"
            )
        ],
    }


def lineage(run: Run) -> dict[str, Any]:
    """Where the run stands among the runs of its thread (SPEC §12): the run it regenerates or
    resends (``replaces``), the newest run that does so to it (``replaced_by``), and the run and
    step it was forked from (``forked_from``)."""
    replaced_by = Run.objects.filter(replaces_id=run.pk).order_by("-created_at").values_list("pk", flat=True)
    forked = run.base_id is not None and run.replaces_id is None
    return {
        "replaces": run.replaces_id,
        "replaced_by": replaced_by.first(),
        "forked_from": {"run_id": run.base_id, "step": run.base_step} if forked else None,
    }


def parent_call(run: Run) -> dict[str, Any] | None:
    """A child run's parent and the call that started it (SPEC §13); None for any other run."""
    if run.parent_id is None:
        return None
    return {"run_id": run.parent_id, "step": run.parent_step, "position": run.parent_position}


def start_lineage(run: Run) -> dict[str, Any]:
    """What a live ``run.start`` says of the run's place in its thread (``lineage``), without a
    query (a run that starts is replaced by nothing yet), and a child run's parent call."""
    forked = run.base_id is not None and run.replaces_id is None
    return {
        "replaces": run.replaces_id,
        "replaced_by": None,
        "forked_from": {"run_id": run.base_id, "step": run.base_step} if forked else None,
        "parent": parent_call(run),
    }


def receipt(run: Run) -> list[str]:
    """The ids of the steering inputs the run took: as its settle returned them (``receipt``, set
    by ``store.save_and_settle``), or read."""
    if run.receipt is not None:
        return list(run.receipt)
    return list(run.inputs.exclude(consumed_step=None).values_list("id", flat=True))


def run_end_event(run: Run, *, waited: bool = True) -> events.Event:
    """The ``run.end`` event of a settled run: its final state and the receipt of inputs it took.
    It reaches every viewer of the run, so its error is the one non-staff viewers see. ``waited``
    False: the caller knows the run never waited, so it has no decisions to read."""
    return events.run_end(
        status=run.status,
        output=run.output,
        error=error_json(run, internals=False),
        usage={"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        inputs=receipt(run),
        # A cancel closes an open approval without a run.resume: the page learns it here.
        decisions=decisions_json(run) if waited else [],
    )
