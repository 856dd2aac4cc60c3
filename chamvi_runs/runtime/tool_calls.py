"""The tool half of a step: run the model's tool calls in order, or stop at the first one that needs
approval; and, after a decision, run the calls the checkpoint left open.

``ToolPhase`` is mixed into ``engine.Execution``, whose claim, abort signal, run row and event
emitter it uses; it never writes run state except through ``store``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.utils import timezone

from . import signals, store
from .agent import Agent, RunContext
from .conf import conf
from .core.messages import open_tool_calls, tool_result
from .core.states import ErrorCode, Status
from .core.types import NO_USAGE, AbortSignal, Message, Usage
from .effects import run_effect
from .errors import LeaseLostError, ToolArgumentsError
from .models import Run, Step, WaitPoint
from .notifications import notify
from .store import Claim, StepRecord
from .tools import Tool, to_jsonable

logger = logging.getLogger(__name__)


# The synthetic result of an open tool call when the run stops before it.
CLOSED_BY = {
    "cancel": "The run was cancelled before this tool call ran.",
    "timeout": "The run timed out before this tool call ran.",
    "failed": "The run failed before this tool call ran.",
}


class Settled(Exception):
    """Internal: the execution has written its final status (or its wait)."""

    def __init__(self, status: str) -> None:
        self.status = status


class ToolPhase:
    claim: Claim
    abort: AbortSignal
    run_row: Run
    invalid_streak: int

    # Provided by engine.Execution.
    emit: Callable[..., None]
    settle: Callable[..., str]

    def after_tools(self, agent: Agent, steps: list[StepRecord]) -> None:
        tool_steps = [s for s in steps if s.kind == "tool"]
        if tool_steps and all(s.output is None and s.error.startswith("invalid call") for s in tool_steps):
            self.invalid_streak += 1
        else:
            self.invalid_streak = 0
        if self.invalid_streak >= int(conf.MAX_INVALID_TOOL_CALLS):
            self.settle(
                Status.FAILED,
                error=(
                    ErrorCode.TOOL_LOOP,
                    f"{self.invalid_streak} model calls in a row made only invalid tool calls",
                ),
            )

    def resume_calls(
        self, agent: Agent, tools: dict[str, Tool], messages: list[Message], index: int
    ) -> tuple[list[Message], int]:
        """The checkpoint ends on tool calls without results: an approval was asked for. Undecided:
        back to waiting, no model call. Decided: the approved call runs, then the calls after it."""
        llm_index = (
            Step.objects.filter(run_id=self.claim.run_id, kind="llm", index__lt=index)
            .order_by("-index")
            .values_list("index", flat=True)
            .first()
        ) or 0
        open_calls = open_tool_calls(messages)
        # Calls are answered in order: the open ones are the last of their model call's calls.
        first_position = len(_last_assistant(messages).get("tool_calls") or []) - len(open_calls)
        waitpoint = WaitPoint.objects.filter(
            run_id=self.claim.run_id, model_step=llm_index, call_position=first_position
        ).first()
        if waitpoint is not None and waitpoint.decision is None:
            try:
                if not store.back_to_waiting(self.claim):
                    raise LeaseLostError(f"run {self.claim.run_id}: claim lost before going back to waiting")
            except store.CancelRequested:
                self.settle(Status.CANCELLED)
            raise Settled(Status.WAITING)
        approved = dict(
            WaitPoint.objects.filter(
                run_id=self.claim.run_id, model_step=llm_index, decision=WaitPoint.Decision.APPROVED
            ).values_list("call_position", "arguments_hash")
        )
        messages, steps = self.answer_calls(
            agent,
            tools,
            open_calls,
            messages,
            [],
            llm_index=llm_index,
            first_position=first_position,
            next_index=index,
            approved=approved,
        )
        if steps:
            store.save_step(self.claim, steps, messages)
            signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
            return messages, steps[-1].index + 1
        return messages, index

    def answer_calls(
        self,
        agent: Agent,
        tools: dict[str, Tool],
        calls: list[dict[str, Any]],
        messages: list[Message],
        steps: list[StepRecord],
        *,
        llm_index: int,
        first_position: int = 0,
        next_index: int | None = None,
        usage: Usage = NO_USAGE,
        inputs: Sequence[str] = (),
        approved: dict[int, str] | None = None,
    ) -> tuple[list[Message], list[StepRecord]]:
        """Run each call in order, answering it in ``messages``. A call that needs approval stops
        here: its wait point is opened (with everything so far) and the execution ends waiting.
        A call is known by its place (``llm_index``, position), never by the provider's call id,
        which providers reuse across turns. ``approved``: position -> arguments hash of the calls
        decided approved (none for a model call just made: its wait point would be saved with it)."""
        index = next_index if next_index is not None else steps[-1].index + 1
        approved = approved or {}
        for position, call in enumerate(calls, start=first_position):
            if self.abort.reason == "lease_lost":
                # Another worker may hold the run now: run nothing more. (Cancel and drain let the
                # step's tools finish, so that its writes can complete.)
                raise LeaseLostError(f"run {self.claim.run_id}: lease lost between tool calls")
            name, raw = call["function"]["name"], call["function"].get("arguments") or ""
            started = timezone.now()
            tool, arguments, error = _parse(tools, name, raw)
            output: Any = None
            if tool is not None:
                key = f"{self.claim.run_id}:{llm_index}:{position}:{name}"
                call_ctx = RunContext(
                    run=self.run_row,
                    agent=agent,
                    abort=self.abort,
                    step_index=index,
                    tool_call_id=call["id"],
                    idempotency_key=key if tool.effect else None,
                )
                if position in approved:
                    if approved[position] != store.arguments_hash(to_jsonable(arguments)):
                        # An approval lets through the exact call it was asked for, nothing else.
                        tool, error = None, "not run: the approval was given for other arguments"
                elif agent.needs_approval(name, arguments, call_ctx):
                    wait = StepRecord(
                        index=index, kind="wait", name=name, input=to_jsonable(arguments), started_at=started
                    )
                    self.open_wait(
                        agent,
                        store.CallRef(llm_index, position, call["id"]),
                        name,
                        arguments,
                        messages,
                        steps,
                        wait,
                        usage=usage,
                        inputs=inputs,
                    )
            # A call that waits for approval is announced by run.waiting, and here once it runs.
            self.emit("tool.call", step=index, tool_call_id=call["id"], name=name, input=_loads(raw))
            if tool is not None:
                output, error = self.invoke(tool, call_ctx, arguments)
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
                ),
            ]
            messages = [*messages, tool_result(call["id"], _result_text(output, error))]
            result = {"error": error} if error else {"output": output}
            self.emit("tool.result", step=index, tool_call_id=call["id"], name=name, **result)
            index += 1
        return messages, steps

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

    def open_wait(
        self,
        agent: Agent,
        call: store.CallRef,
        name: str,
        arguments: dict[str, Any],
        messages: list[Message],
        steps: list[StepRecord],
        wait: StepRecord,
        *,
        usage: Usage,
        inputs: Sequence[str],
    ) -> None:
        ttl = agent.approval_ttl or conf.approval_ttl
        try:
            waitpoint = store.open_wait(
                self.claim,
                [*steps, wait],
                messages,
                call=call,
                tool_name=name,
                tool_input=to_jsonable(arguments),
                ttl=ttl,
                usage=usage,
                consumed_inputs=inputs,
            )
        except store.CancelRequested:
            # The cancel came while the model answered: it wins over the wait. What the step did
            # is kept, and the open calls are answered as cancelled.
            if steps:
                store.save_step(self.claim, steps, messages, usage=usage, consumed_inputs=inputs)
                signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
            self.settle(Status.CANCELLED, close=CLOSED_BY["cancel"])
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=[*steps, wait])
        self.emit(
            "run.waiting",
            approval_id=waitpoint.approval_id,
            tool_name=name,
            input=waitpoint.input,
            expires_at=waitpoint.expires_at.isoformat(),
        )
        run = Run.objects.get(pk=self.claim.run_id)
        signals.run_waiting.send(Run, run=run, waitpoint=waitpoint)
        notify(agent, run, waitpoint)
        raise Settled(Status.WAITING)


def _last_assistant(messages: list[Message]) -> Message:
    return next((m for m in reversed(messages) if m.get("role") == "assistant"), {})


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
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return raw


def _result_text(output: Any, error: str) -> str:
    if error:
        return f"Error: {error}"
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
