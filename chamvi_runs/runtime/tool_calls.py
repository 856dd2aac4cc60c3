"""The tool half of a step: run the model's tool calls in order, answering each in the history, and
stop at the first one that needs approval. ``ToolCalls`` writes nothing and settles nothing: it
returns what it did (``Answered``), and the engine saves it or opens the wait.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from ..agents.agent import Agent, RunContext
from ..agents.tools import Tool, to_jsonable
from ..core.decisions import idempotency_key
from ..core.messages import tool_result
from ..core.records import CallRef, Claim, StepRecord, arguments_hash
from ..core.storable import storable
from ..core.types import AbortSignal, Message
from ..errors import LeaseLostError, ToolArgumentsError
from ..models import Run
from .effects import run_effect

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Approval:
    """A call that needs approval before it runs: its place, name, arguments and wait step."""

    call: CallRef
    name: str
    arguments: Any
    wait: StepRecord


@dataclass
class Answered:
    """The history and steps after the calls that ran; ``approval``: the call they stopped at."""

    messages: list[Message]
    steps: list[StepRecord]
    approval: Approval | None = None


class ToolCalls:
    """Runs one execution's tool calls, with the agent's tools and the execution's claim."""

    def __init__(
        self,
        claim: Claim,
        abort: AbortSignal,
        run: Run,
        agent: Agent,
        tools: dict[str, Tool],
        emit: Callable[..., None],
    ) -> None:
        self.claim = claim
        self.abort = abort
        self.run = run
        self.agent = agent
        self.tools = tools
        self.emit = emit

    def answer(
        self,
        calls: list[dict[str, Any]],
        messages: list[Message],
        steps: list[StepRecord],
        *,
        llm_index: int,
        first_position: int = 0,
        next_index: int | None = None,
        approved: dict[int, str] | None = None,
    ) -> Answered:
        """Run each call in order, answering it in ``messages``. A call is known by its place
        (``llm_index``, position), never by the provider's call id, which providers reuse across
        turns. ``approved``: position -> arguments hash of the calls decided approved (none for a
        model call just made: its wait point would be saved with it)."""
        index = next_index if next_index is not None else steps[-1].index + 1
        approved = approved or {}
        for position, call in enumerate(calls, start=first_position):
            if self.abort.reason == "lease_lost":
                # Another worker may hold the run now: run nothing more. (Cancel and drain let the
                # step's tools finish, so that its writes can complete.)
                raise LeaseLostError(f"run {self.claim.run_id}: lease lost between tool calls")
            name, raw = call["function"]["name"], call["function"].get("arguments") or ""
            started = timezone.now()
            tool, arguments, error = _parse(self.tools, name, raw)
            invalid = tool is None
            output: Any = None
            if tool is not None:
                ctx = RunContext(
                    run=self.run,
                    agent=self.agent,
                    abort=self.abort,
                    step_index=index,
                    tool_call_id=call["id"],
                    idempotency_key=idempotency_key(self.claim.run_id, llm_index, position, name)
                    if tool.effect
                    else None,
                )
                if position in approved:
                    if approved[position] != arguments_hash(to_jsonable(arguments)):
                        # An approval lets through the exact call it was asked for, nothing else.
                        tool, error = None, "not run: the approval was given for other arguments"
                elif self.agent.needs_approval(name, arguments, ctx):
                    wait = StepRecord(
                        index=index, kind="wait", name=name, input=to_jsonable(arguments), started_at=started
                    )
                    approval = Approval(
                        CallRef(llm_index, position, call["id"]), name, to_jsonable(arguments), wait
                    )
                    return Answered(messages, steps, approval)
            # A call that waits for approval is announced by run.waiting, and here once it runs.
            self.emit("tool.call", step=index, tool_call_id=call["id"], name=name, input=_loads(raw))
            if tool is not None:
                output, error = self.invoke(tool, ctx, arguments)
            # An exception's text may quote what the model sent, a lone surrogate included.
            error = storable(error)
            steps = [
                *steps,
                StepRecord(
                    index=index,
                    kind="tool",
                    name=name,
                    input=to_jsonable(arguments),
                    output=output,
                    error=error,
                    started_at=started,
                    # The tool's end, not the write's: that waits for the call's later tools.
                    finished_at=timezone.now(),
                    invalid_call=invalid,
                ),
            ]
            messages = [*messages, tool_result(call["id"], _result_text(output, error))]
            result = {"error": error} if error else {"output": output}
            self.emit("tool.result", step=index, tool_call_id=call["id"], name=name, **result)
            index += 1
        return Answered(messages, steps)

    def invoke(self, tool: Tool, ctx: RunContext, arguments: dict[str, Any]) -> tuple[Any, str]:
        if tool.effect:
            return run_effect(self.claim, tool, ctx, arguments)
        try:
            return to_jsonable(tool.invoke(ctx, arguments)), ""
        except LeaseLostError:
            raise
        except Exception as exc:
            logger.info("tool %s raised", tool.name, exc_info=True)
            return None, f"{type(exc).__name__}: {exc}"


def _parse(tools: dict[str, Tool], name: str, raw: str) -> tuple[Tool | None, Any, str]:
    """The tool and its validated arguments; or no tool, the raw arguments and why the call is invalid."""
    tool = tools.get(name)
    if tool is None:
        return None, _loads(raw), f"invalid call: there is no tool named {name!r}"
    try:
        return tool, tool.validate(raw), ""
    except ToolArgumentsError as exc:
        return None, _loads(raw), f"invalid call: {exc}"


def _loads(raw: str) -> Any:
    try:
        return storable(json.loads(raw)) if raw else {}
    except json.JSONDecodeError:
        return raw


def _result_text(output: Any, error: str) -> str:
    if error:
        return f"Error: {error}"
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
