"""How the pages and the admin show wait points: a question's text and the form of its answer, an
approval's edited arguments beside the proposal, a decision's line. ``render.js`` says the same in
the browser, for what a page adds live."""

from __future__ import annotations

import json
from typing import Any

from ..models import WaitPoint
from ..streaming.serializers import question

# What a diff of edited arguments says of a key one side lacks.
NONE_SHOWN = "(none)"


def compact(value: Any) -> str:
    """A JSON value on one line, as render.js's ``compact`` writes it (``JSON.stringify``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def argument_changes(proposed: Any, approved: Any) -> list[dict[str, str]]:
    """What a person changed in the arguments before approving them: per key of an object, else the
    whole value (``key`` ""), each side as compact JSON. None when nothing was edited. render.js's
    ``argumentChanges`` says the same."""
    if approved is None:
        return []
    if not (isinstance(proposed, dict) and isinstance(approved, dict)):
        if canonical(proposed) == canonical(approved):
            return []
        return [{"key": "", "before": compact(proposed), "after": compact(approved)}]
    changes = []
    for key in [*proposed, *(k for k in approved if k not in proposed)]:
        before = compact(proposed[key]) if key in proposed else NONE_SHOWN
        after = compact(approved[key]) if key in approved else NONE_SHOWN
        # A key only one side has shows as (none) on the other: compared by the JSON itself.
        if canonical(proposed.get(key)) != canonical(approved.get(key)) or before != after:
            changes.append({"key": str(key), "before": before, "after": after})
    return changes


def answer_text(value: Any) -> str:
    """A question's answer on one line: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else compact(value)


def answer_form(schema: Any) -> dict[str, Any]:
    """How a page asks for an answer of the JSON Schema ``schema`` (render.js's ``answerForm`` does
    the same): Yes/No for a boolean, one of its ``choices`` for an enum (each ``value`` the choice
    as JSON), a line of text for a string, JSON typed out for anything else (None: any value)."""
    if isinstance(schema, dict):
        choices = schema.get("enum")
        if isinstance(choices, list) and choices:
            return {
                "kind": "choice",
                "choices": [{"value": compact(c), "label": answer_text(c)} for c in choices],
            }
        if schema.get("type") == "boolean":
            return {"kind": "boolean"}
        if schema.get("type") == "string":
            return {"kind": "text"}
    return {"kind": "json"}


def open_wait(waitpoint: WaitPoint) -> dict[str, Any]:
    """An open wait point as the pages show it: an approval (``editable``: its arguments may be
    changed) or a question, with its text and the form of its answer."""
    return {
        "waitpoint": waitpoint,
        "question": question(waitpoint),
        "form": answer_form(waitpoint.answer_schema) if waitpoint.kind == WaitPoint.Kind.INPUT else None,
    }


def decision_row(waitpoint: WaitPoint) -> dict[str, Any]:
    """A decided wait point as the pages list it: an answer's text, or what an approver changed."""
    answered = waitpoint.decision == WaitPoint.Decision.ANSWERED
    return {
        "waitpoint": waitpoint,
        "answer": answer_text(waitpoint.answer) if answered else None,
        "changes": argument_changes(waitpoint.input, waitpoint.approved_input),
    }
