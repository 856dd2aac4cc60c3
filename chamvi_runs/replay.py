"""Events of a run whose replay buffer has expired, rebuilt from its stored steps.

Deltas are not stored, so a step's text arrives as one ``delta`` per kind; seq still starts at 1
and has no gaps, as for a live run.
"""

from __future__ import annotations

from typing import Any

from .broadcast import event_log
from .core.states import TERMINAL
from .models import Run
from .serializers import run_end_event


def replay_after(run_id: str, after: int) -> list[dict[str, Any]]:
    """The run's events with a seq above ``after``: from the buffer, or, for a settled run whose
    buffer has expired, rebuilt from its stored steps. Serves the websocket and SSE alike."""
    log = event_log()
    events = log.after(run_id, after)
    if events or (after and log.after(run_id, 0)):
        return events
    run = Run.objects.filter(pk=run_id).first()
    # Only a settled run: a live one goes on publishing with the buffer's own seq.
    if run is None or run.status not in TERMINAL:
        return []
    return [e for e in events_from_steps(run) if e["seq"] > after]


def events_from_steps(run: Run) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "run.start", "status": "running"}]
    # Tool steps do not store their call id; each takes the first unused call of its name from the
    # model call before it, in order, as the engine ran them.
    unused: list[tuple[str, str]] = []
    for step in run.steps.all():
        base = {"step": step.index, "attempt": step.attempt}
        output = step.output or {}
        if step.kind == "llm":
            events.append({"type": "step.start", **base})
            for kind in ("reasoning", "text"):
                if output.get(kind):
                    events.append({"type": "delta", **base, "kind": kind, "text": output[kind]})
            events.append({"type": "step.end", **base, "finish_reason": output.get("finish_reason")})
            unused = [(c["id"], c["function"]["name"]) for c in output.get("tool_calls") or []]
        elif step.kind == "tool":
            call_id = next((cid for cid, name in unused if name == step.name), None)
            if call_id is not None:
                unused.remove((call_id, step.name))
            call = {"step": step.index, "tool_call_id": call_id, "name": step.name}
            events.append({"type": "tool.call", **call, "input": step.input})
            result = {"error": step.error} if step.error else {"output": step.output}
            events.append({"type": "tool.result", **call, **result})
    waiting = run.waitpoints.filter(decision__isnull=True).first()
    if waiting is not None and run.status == "waiting":
        events.append(
            {
                "type": "run.waiting",
                "approval_id": waiting.approval_id,
                "tool_name": waiting.tool_name,
                "input": waiting.input,
                "expires_at": waiting.expires_at.isoformat() if waiting.expires_at else None,
            }
        )
    if run.finished_at is not None:
        events.append(run_end_event(run))
    return [{**event, "run_id": run.pk, "seq": n} for n, event in enumerate(events, start=1)]
