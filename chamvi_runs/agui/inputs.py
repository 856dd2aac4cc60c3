"""What an AG-UI request (``RunAgentInput``) asks of a run: a new turn of a thread, or the decisions
that resume a waiting run. Every refusal is an ``ApiError`` that names the field at fault."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic
from ag_ui.core import RunAgentInput

from ..web.errors import ApiError


@dataclass(frozen=True)
class Start:
    """A new run of the agent in the thread, with the last user message as its payload."""

    thread: str
    run_id: str
    text: str


@dataclass(frozen=True)
class Decision:
    """One interrupt answered: an approval (``approve``, ``reason``, ``arguments``) or a question
    (``answer``)."""

    approval_id: str
    resolved: bool
    payload: Any


@dataclass(frozen=True)
class Resume:
    thread: str
    run_id: str
    decisions: list[Decision]


def parse(data: dict[str, Any]) -> Start | Resume:
    try:
        request = RunAgentInput.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise ApiError(400, "invalid_field", f"not an AG-UI RunAgentInput: {where}: {first['msg']}") from None
    if not request.thread_id or len(request.thread_id) > 200:
        raise ApiError(
            400, "invalid_field", "'threadId' must be a non-empty string of at most 200 characters"
        )
    if not request.run_id or len(request.run_id) > 150:
        raise ApiError(400, "invalid_field", "'runId' must be a non-empty string of at most 150 characters")
    if request.resume:
        return Resume(
            request.thread_id,
            request.run_id,
            [Decision(e.interrupt_id, e.status == "resolved", e.payload) for e in request.resume],
        )
    last = request.messages[-1] if request.messages else None
    if last is None or last.role != "user":
        raise ApiError(
            400,
            "invalid_field",
            "'messages' must end with the user's message (the thread's history is kept by the server), "
            "or 'resume' must answer the run's interrupts",
        )
    return Start(request.thread_id, request.run_id, _text(last.content))


def _text(content: Any) -> str:
    if isinstance(content, str):
        text = content
    else:
        if any(part.type != "text" for part in content):
            raise ApiError(400, "invalid_field", "only text parts are taken from the user's message")
        text = "\n".join(part.text for part in content)
    if not text.strip():
        raise ApiError(400, "invalid_field", "the user's message is empty")
    return text


def approval(decision: Decision) -> tuple[bool, str, dict[str, Any] | None]:
    """An approval's resume payload as (approve, reason, edited arguments): ``{"approved": bool,
    "reason"?: str, "arguments"?: {...}}`` or a bare bool; a cancelled interrupt denies."""
    if not decision.resolved:
        return False, "cancelled from the AG-UI client", None
    payload = decision.payload
    if isinstance(payload, bool):
        return payload, "", None
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise ApiError(
            400,
            "invalid_field",
            f'resume of {decision.approval_id}: the payload must be {{"approved": true|false, '
            '"reason"?: string, "arguments"?: object}',
        )
    unknown = sorted(set(payload) - {"approved", "reason", "arguments"})
    if unknown:
        raise ApiError(400, "invalid_field", f"resume of {decision.approval_id}: unknown fields {unknown}")
    reason = payload.get("reason", "")
    if not isinstance(reason, str):
        raise ApiError(400, "invalid_field", f"resume of {decision.approval_id}: 'reason' must be a string")
    arguments = payload.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise ApiError(
            400, "invalid_field", f"resume of {decision.approval_id}: 'arguments' must be an object"
        )
    return payload["approved"], reason, arguments
