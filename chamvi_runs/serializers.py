"""Runs, steps and wait points as the JSON the HTTP API and pages return."""

from __future__ import annotations

from typing import Any

from .models import Run, Step, WaitPoint


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


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


def waitpoint_json(waitpoint: WaitPoint | None) -> dict[str, Any] | None:
    if waitpoint is None:
        return None
    return {
        "approval_id": waitpoint.approval_id,
        "run_id": waitpoint.run_id,
        "kind": waitpoint.kind,
        "tool_name": waitpoint.tool_name,
        "input": waitpoint.input,
        "expires_at": _iso(waitpoint.expires_at),
        "notified_at": _iso(waitpoint.notified_at),
        "decision": waitpoint.decision,
        "decided_by": waitpoint.decided_by_id,
        "decided_at": _iso(waitpoint.decided_at),
        "reason": waitpoint.reason,
        "created_at": _iso(waitpoint.created_at),
    }


def run_json(run: Run, *, detail: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "trigger": run.trigger,
        "concurrency_key": run.concurrency_key,
        "thread": run.thread,
        "output": run.output,
        "error": run.error,
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "model_calls": run.model_calls,
        "claim_owner": run.claim_owner,
        "claim_expires_at": _iso(run.claim_expires_at),
        "cancel_requested": run.cancel_requested,
        "created_by": run.created_by_id,
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
    }
    if detail:
        data["steps"] = [step_json(s) for s in run.steps.all()]
        data["waiting"] = waitpoint_json(run.waitpoints.filter(decision__isnull=True).first())
        data["inputs"] = list(run.inputs.exclude(consumed_step=None).values_list("id", flat=True))
    return data


def run_end_event(run: Run) -> dict[str, Any]:
    """The ``run.end`` event of a settled run: its final state and the receipt of inputs it took."""
    return {
        "type": "run.end",
        "status": run.status,
        "output": run.output,
        "error": run.error,
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        "inputs": list(run.inputs.exclude(consumed_step=None).values_list("id", flat=True)),
    }
