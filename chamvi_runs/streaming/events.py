"""Every event a run's stream carries, built in one place: the type names, and a function per type
that lays out its fields. An execution emits these (``runtime``) and a replay rebuilds them from the
stored steps (``replay``) through the same functions, so an event and its rebuilt twin cannot
differ. ``vocabulary`` lists the same types with their fields for the docs and the client; the
broadcaster stamps ``run_id`` and ``seq`` after the fields. The buffer's Lua scripts (``buffer/lua``)
spell ``run.start``, ``run.waiting``, ``run.end`` and ``replay.truncated`` themselves.

Nothing here reads a row: the callers pass values (``serializers`` turns rows into them), so the
cursor and the buffer's rules may import the type names without the models.
"""

from __future__ import annotations

from typing import Any

from ..core.states import Status

RUN_START = "run.start"
RUN_RESUME = "run.resume"
INPUT = "input"
STEP_START = "step.start"
DELTA = "delta"
STEP_END = "step.end"
TOOL_CALL = "tool.call"
TOOL_RESULT = "tool.result"
RUN_WAITING = "run.waiting"
RUN_END = "run.end"
REPLAY_TRUNCATED = "replay.truncated"

Event = dict[str, Any]

# An execution starts or resumes running; the status it ends with comes in run.end.
_RUNNING = Status.RUNNING.value


def run_start(
    *,
    replaces: str | None,
    replaced_by: str | None,
    forked_from: dict[str, Any] | None,
    parent: dict[str, Any] | None = None,
) -> Event:
    return {
        "type": RUN_START,
        "status": _RUNNING,
        "replaces": replaces,
        "replaced_by": replaced_by,
        "forked_from": forked_from,
        "parent": parent,
    }


def run_resume(decision: dict[str, Any] | None) -> Event:
    """After a decision, an answer or an expiry: ``decision``; after a drain or a recovery: none."""
    resumed: Event = {"type": RUN_RESUME, "status": _RUNNING}
    if decision is not None:
        resumed["decision"] = decision
    return resumed


def input_taken(*, step: int, input_id: str, payload: Any) -> Event:
    return {"type": INPUT, "step": step, "input_id": input_id, "payload": payload}


def step_start(*, step: int, attempt: int) -> Event:
    return {"type": STEP_START, "step": step, "attempt": attempt}


def delta(*, step: int, attempt: int, kind: str, text: str) -> Event:
    return {"type": DELTA, "step": step, "attempt": attempt, "kind": kind, "text": text}


def step_end(*, step: int, attempt: int, finish_reason: str | None) -> Event:
    return {"type": STEP_END, "step": step, "attempt": attempt, "finish_reason": finish_reason}


def tool_call(*, step: int, tool_call_id: str | None, name: str, input: Any) -> Event:
    return {"type": TOOL_CALL, "step": step, "tool_call_id": tool_call_id, "name": name, "input": input}


def tool_result(*, step: int, tool_call_id: str | None, name: str, output: Any, error: str) -> Event:
    """The tool's ``error`` when it failed, else its ``output``: never both."""
    result = {"error": error} if error else {"output": output}
    return {"type": TOOL_RESULT, "step": step, "tool_call_id": tool_call_id, "name": name, **result}


def run_waiting(
    *,
    approval_id: str,
    kind: str,
    tool_name: str,
    tool_call_id: str,
    input: Any,
    question: str | None,
    answer_schema: Any,
    client: bool,
    editable: bool,
    expires_at: str | None,
) -> Event:
    return {
        "type": RUN_WAITING,
        "approval_id": approval_id,
        "kind": kind,
        "tool_name": tool_name,
        "tool_call_id": tool_call_id,
        "input": input,
        "question": question,
        "answer_schema": answer_schema,
        "client": client,
        "editable": editable,
        "expires_at": expires_at,
    }


def run_end(
    *,
    status: str,
    output: Any,
    error: dict[str, str] | None,
    usage: dict[str, int],
    inputs: list[str],
    decisions: list[dict[str, Any]],
) -> Event:
    return {
        "type": RUN_END,
        "status": status,
        "output": output,
        "error": error,
        "usage": usage,
        "inputs": inputs,
        "decisions": decisions,
    }


def replay_truncated(*, run_id: str, status: str, from_step: int) -> Event:
    """The marker that opens a rebuild: the events before it are gone. Unlike the others it names
    its run itself: it is made where no broadcaster stamps one."""
    return {"type": REPLAY_TRUNCATED, "run_id": run_id, "status": status, "from_step": from_step}
