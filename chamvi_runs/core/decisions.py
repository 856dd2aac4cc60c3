"""The decisions of the tool loop, as pure functions returning what to do. The engine
(``runtime.engine``) carries them out: it reads, calls the model and tools, and writes through the
store; everything it decides on the way is here, testable without a database.

A decision is ``None`` (go on), a ``Settle`` (end the execution with this status), ``FINISH``
(complete with the agent's parsed final text), or ``ABANDON`` (the claim is lost: write nothing).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from .budget import Budget
from .records import Claim, StepRecord
from .states import ErrorCode, Status
from .types import ModelTurn

# The synthetic result of an open tool call when the run stops before it.
CLOSED_BY = {
    "cancel": "The run was cancelled before this tool call ran.",
    "timeout": "The run timed out before this tool call ran.",
    "failed": "The run failed before this tool call ran.",
}

INCOMPLETE = "the stream ended without a finish reason"


@dataclass(frozen=True)
class Settle:
    """End the execution: ``status``, with ``error`` (code, message) and the text that answers the
    tool calls left open (``close``; a terminal settle answers them anyway, generically)."""

    status: Status
    error: tuple[str, str] | None = None
    close: str | None = None


class Marker(enum.Enum):
    FINISH = "finish"
    """Complete the run with the agent's parsed final text (or fail ``invalid_output``)."""
    ABANDON = "abandon"
    """The claim is lost: stop, write nothing more (``LeaseLostError``)."""


FINISH = Marker.FINISH
ABANDON = Marker.ABANDON

CANCELLED = Settle(Status.CANCELLED, close=CLOSED_BY["cancel"])


def on_claim(claim: Claim, max_attempts: int) -> Settle | None:
    """Before anything runs: a cancel requested between executions wins; a run whose executions
    keep dying before they save anything (a tool that kills its worker) fails."""
    if claim.cancel_requested:
        return CANCELLED
    if claim.stalled >= max_attempts:
        detail = (
            f"{claim.stalled} executions in a row ended without saving a step "
            "(their worker died: a tool that crashes or exhausts the process?)"
        )
        return Settle(Status.FAILED, (ErrorCode.TOO_MANY_ATTEMPTS, detail), CLOSED_BY["failed"])
    return None


def on_abort(reason: str | None) -> Settle | Marker | None:
    """What the abort signal's reason asks for: nothing, a drain, a timeout, a cancel, or a lost lease."""
    if reason is None:
        return None
    if reason == "lease_lost":
        return ABANDON
    if reason == "drain":
        return Settle(Status.INTERRUPTED)
    if reason == "timeout":
        return Settle(
            Status.FAILED, (ErrorCode.TIMEOUT, "the execution ran out of time"), CLOSED_BY["timeout"]
        )
    return CANCELLED


def on_refused_wait() -> Settle:
    """A write that keeps the run going (open a wait, back to waiting, interrupted) was refused: a
    cancel was requested, or the claim is lost, in which case this settle is refused too."""
    return CANCELLED


def budget_gate(budget: Budget, model_calls: int, tokens: int) -> Settle | None:
    """Before each model call: budgets count across executions, so a run that used them fails."""
    if budget.steps_exhausted(model_calls):
        detail = f"max_steps={budget.max_steps} model calls used"
    elif budget.tokens_exhausted(tokens):
        detail = f"max_tokens={budget.max_tokens} tokens used"
    else:
        return None
    return Settle(Status.FAILED, (ErrorCode.BUDGET_EXCEEDED, detail), CLOSED_BY["failed"])


class Turn(enum.Enum):
    FINAL = "final"
    """A complete answer without tool calls."""
    TOOLS = "tools"
    """A complete answer with tool calls: run them (or ask for approval)."""
    BROKEN = "broken"
    """An error part, or a stream cut before its finish reason: save the text, run no tool, fail."""


def classify(turn: ModelTurn) -> Turn:
    if turn.error is not None or turn.finish_reason is None:
        return Turn.BROKEN
    return Turn.TOOLS if turn.tool_calls else Turn.FINAL


def finish_reason(turn: ModelTurn) -> str | None:
    """What the ``llm`` step records: ``error`` for an error part, None for a cut stream."""
    return "error" if turn.error is not None else turn.finish_reason


def broken(turn: ModelTurn) -> tuple[str, Settle]:
    """The error text the ``llm`` step of a broken turn records, and how the run fails."""
    if turn.error is None:
        return INCOMPLETE, Settle(Status.FAILED, (ErrorCode.INCOMPLETE_RESPONSE, INCOMPLETE))
    return turn.error, Settle(Status.FAILED, (ErrorCode.MODEL_ERROR, turn.error))


def saved_ending(
    last_role: str | None, inputs_pending: bool, last_finish: str | None, last_error: str, has_llm_step: bool
) -> Settle | Marker | None:
    """An earlier execution saved a step that ended the run, then died before settling: settle as it
    would have, without calling the model again. None: the saved history does not end the run (it
    ends on a tool result, or steering input waits for the model)."""
    if last_role != "assistant" or inputs_pending or not has_llm_step:
        return None
    if last_finish == "error":
        return Settle(Status.FAILED, (ErrorCode.MODEL_ERROR, last_error))
    if last_finish is None:
        return Settle(Status.FAILED, (ErrorCode.INCOMPLETE_RESPONSE, last_error))
    return FINISH


def invalid_streak(streak: int, steps: Iterable[StepRecord]) -> int:
    """Model calls in a row whose tool calls were all invalid (no such tool, bad arguments)."""
    tool_steps = [s for s in steps if s.kind == "tool"]
    return streak + 1 if tool_steps and all(s.invalid_call for s in tool_steps) else 0


def streak_gate(streak: int, limit: int) -> Settle | None:
    """A model stuck making invalid calls fails instead of burning its budget."""
    if streak < limit:
        return None
    detail = f"{streak} model calls in a row made only invalid tool calls"
    return Settle(Status.FAILED, (ErrorCode.TOOL_LOOP, detail))


def idempotency_key(run_id: str, model_step: int, position: int, tool_name: str) -> str:
    """Stable across re-executions of the same step, so a remote API can deduplicate an effect."""
    return f"{run_id}:{model_step}:{position}:{tool_name}"
