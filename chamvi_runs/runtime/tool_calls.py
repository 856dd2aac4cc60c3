"""The tool half of a step: run the model's tool calls in order, answering each in the history, and
stop at the first one that waits for a person: a call that needs approval, or questions to the
run's user (``human_tool``; questions in a row wait together). ``ToolCalls`` writes nothing and
settles nothing: it returns what it did (``Answered``), and the engine saves it or opens the wait.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ..agents.agent import Agent, RunContext, registry
from ..agents.tools import Tool, to_jsonable
from ..conf import conf
from ..core.decisions import idempotency_key
from ..core.messages import tool_result
from ..core.records import CallRef, Claim, Decided, StepRecord, WaitRequest, arguments_hash
from ..core.storable import storable
from ..core.types import AbortSignal, Message
from ..errors import AgentNotFound, LeaseLostError, ToolArgumentsError
from ..models import Run
from ..streaming import events
from .effects import run_effect

logger = logging.getLogger(__name__)


NO_ANSWER = "No answer came: the question expired before the user answered it."


@dataclass
class Answered:
    """The history and steps after the calls that ran; ``waits``: the wait points they stopped at
    (their wait steps follow ``steps``)."""

    messages: list[Message]
    steps: list[StepRecord]
    waits: list[WaitRequest] = field(default_factory=list)

    @property
    def wait_steps(self) -> list[StepRecord]:
        return [
            StepRecord(
                index=w.step_index, kind="wait", name=w.tool_name, input=w.input, started_at=w.started_at
            )
            for w in self.waits
        ]


class ToolCalls:
    """Runs one execution's tool calls, with the agent's tools and the execution's claim."""

    def __init__(
        self,
        claim: Claim,
        abort: AbortSignal,
        run: Run,
        agent: Agent,
        tools: dict[str, Tool],
        emit: Callable[[events.Event], None],
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
        decided: dict[int, Decided] | None = None,
    ) -> Answered:
        """Run each call in order, answering it in ``messages``. A call is known by its place
        (``llm_index``, position), never by the provider's call id, which providers reuse across
        turns. ``decided``: position -> decision of the calls a person decided (none for a model
        call just made: its wait points would be saved with it)."""
        index = next_index if next_index is not None else steps[-1].index + 1
        decided = decided or {}
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
            note = ""
            ctx = None
            if tool is not None:
                ctx = self.context(tool, index, call["id"], llm_index, position)
                if position in decided:
                    tool, arguments, output, error, note = _as_decided(tool, arguments, decided[position])
                elif tool.question is not None:
                    waits = self.questions(
                        calls[position - first_position :], llm_index, position, index, started
                    )
                    return Answered(messages, steps, waits)
                elif tool.delegate is not None and self.run.depth < conf.MAX_CHILD_DEPTH:
                    waits = self.children(
                        calls[position - first_position :], llm_index, position, index, started
                    )
                    return Answered(messages, steps, waits)
                elif tool.delegate is not None:
                    error = (
                        f"not run: delegating to {tool.delegate} would pass MAX_CHILD_DEPTH "
                        f"({conf.MAX_CHILD_DEPTH} runs deep); do the task without delegating"
                    )
                    tool = None
                elif self.agent.needs_approval(tool, arguments, ctx):
                    return Answered(
                        messages,
                        steps,
                        [self.approval(call, tool, arguments, llm_index, position, index, started)],
                    )
            # A call that waits for a person is announced by run.waiting, and here once it runs.
            shown = _shown(arguments, raw, note)
            self.emit(events.tool_call(step=index, tool_call_id=call["id"], name=name, input=shown))
            if tool is not None and ctx is not None:
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
            messages = [*messages, tool_result(call["id"], note + _result_text(output, error))]
            self.emit(
                events.tool_result(step=index, tool_call_id=call["id"], name=name, output=output, error=error)
            )
            index += 1
        return Answered(messages, steps)

    def context(self, tool: Tool, index: int, call_id: str, llm_index: int, position: int) -> RunContext:
        return RunContext(
            run=self.run,
            agent=self.agent,
            abort=self.abort,
            step_index=index,
            tool_call_id=call_id,
            idempotency_key=idempotency_key(self.claim.run_id, llm_index, position, tool.name)
            if tool.effect
            else None,
        )

    def ttl(self, own: timedelta | None = None) -> timedelta:
        return own or self.agent.approval_ttl or conf.APPROVAL_TTL

    def approval(
        self,
        call: dict[str, Any],
        tool: Tool,
        arguments: Any,
        llm_index: int,
        position: int,
        index: int,
        started: datetime,
    ) -> WaitRequest:
        return WaitRequest(
            call=CallRef(llm_index, position, call["id"]),
            tool_name=tool.name,
            input=to_jsonable(arguments),
            kind="approval",
            ttl=self.ttl(),
            step_index=index,
            started_at=started,
            editable=self.agent.editable(tool),
        )

    def questions(
        self, calls: list[dict[str, Any]], llm_index: int, position: int, index: int, started: datetime
    ) -> list[WaitRequest]:
        """The question at ``position`` and the questions right after it in the same model call:
        the user answers them in any order, and the run goes on once all are answered."""
        return [
            WaitRequest(
                call=call,
                tool_name=tool.name,
                input=to_jsonable(arguments),
                kind="input",
                ttl=self.ttl(tool.question.ttl),
                step_index=index + offset,
                started_at=started,
                editable=False,
                answer_schema=tool.question.answer_schema,
                client=tool.question.client,
            )
            for offset, call, tool, arguments in self._alike(calls, llm_index, position, "question")
            if tool.question is not None
        ]

    def children(
        self, calls: list[dict[str, Any]], llm_index: int, position: int, index: int, started: datetime
    ) -> list[WaitRequest]:
        """The delegation at ``position`` and those right after it in the same model call: their
        child runs are started together, run at once, and the run goes on once all have settled."""
        return [
            WaitRequest(
                call=call,
                tool_name=tool.name,
                input=to_jsonable(arguments),
                kind="child",
                ttl=timedelta(0),
                step_index=index + offset,
                started_at=started,
                editable=False,
                delegate=tool.delegate,
                delegate_version=_version_of(tool.delegate),
            )
            for offset, call, tool, arguments in self._alike(calls, llm_index, position, "delegate")
        ]

    def _alike(
        self, calls: list[dict[str, Any]], llm_index: int, position: int, attribute: str
    ) -> list[tuple[int, CallRef, Tool, Any]]:
        """``calls`` from the first on while their tools have ``attribute`` set (a question, a
        delegation): (offset, the call by its place, its tool, its validated arguments)."""
        alike = []
        for offset, call in enumerate(calls):
            tool, arguments, _error = _parse(
                self.tools, call["function"]["name"], call["function"].get("arguments") or ""
            )
            if tool is None or getattr(tool, attribute) is None:
                break
            alike.append((offset, CallRef(llm_index, position + offset, call["id"]), tool, arguments))
        return alike

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


def _version_of(agent: str | None) -> str:
    """The version of the agent a delegation starts (none when this process lacks that agent: its
    child run then fails ``agent_not_found``, as any run of an unknown agent does)."""
    try:
        return registry.get(agent).version if agent else ""
    except AgentNotFound:
        return ""


def _parse(tools: dict[str, Tool], name: str, raw: str) -> tuple[Tool | None, Any, str]:
    """The tool and its validated arguments; or no tool, the raw arguments and why the call is invalid."""
    tool = tools.get(name)
    if tool is None:
        return None, _loads(raw), f"invalid call: there is no tool named {name!r}"
    try:
        return tool, tool.validate(raw), ""
    except ToolArgumentsError as exc:
        return None, _loads(raw), f"invalid call: {exc}"


def _as_decided(tool: Tool, arguments: Any, decided: Decided) -> tuple[Tool | None, Any, Any, str, str]:
    """A decided call: the tool to run (None: nothing to run) with its arguments, or its output or
    error, and the note that tells the model what a person changed."""
    if decided.kind == "input":
        answered = decided.decision == "answered"
        return None, arguments, decided.answer if answered else NO_ANSWER, "", ""
    if decided.kind == "child":
        # The child's output, or why it has none (failed, cancelled: a tool error for the model).
        if decided.decision == "answered":
            return None, arguments, decided.answer, "", ""
        return None, arguments, None, decided.reason or f"the child run ended {decided.decision}", ""
    approved = arguments
    if decided.approved_input is not None:
        try:
            approved = tool.validate(json.dumps(decided.approved_input))
        except ToolArgumentsError as exc:
            # Validated when approved; a deploy may have changed the tool since.
            return None, arguments, None, f"not run: the approved arguments no longer fit the tool: {exc}", ""
    if decided.arguments_hash != arguments_hash(to_jsonable(approved)):
        # An approval lets through the exact call it was asked for, nothing else.
        return None, arguments, None, "not run: the approval was given for other arguments", ""
    if approved is arguments:
        return tool, arguments, None, "", ""
    note = (
        "A person changed the arguments before approving this call; it ran with "
        f"{json.dumps(to_jsonable(approved), ensure_ascii=False)} instead of "
        f"{json.dumps(to_jsonable(arguments), ensure_ascii=False)}.\nResult: "
    )
    return tool, approved, None, "", note


def _shown(arguments: Any, raw: str, edited: str) -> Any:
    """A call's input as ``tool.call`` shows it: as the model sent it, or the arguments a person
    approved instead."""
    return to_jsonable(arguments) if edited else _loads(raw)


def _loads(raw: str) -> Any:
    try:
        return storable(json.loads(raw)) if raw else {}
    except json.JSONDecodeError:
        return raw


def _result_text(output: Any, error: str) -> str:
    if error:
        return f"Error: {error}"
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
