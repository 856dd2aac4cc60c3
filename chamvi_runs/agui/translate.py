"""A run's events (our vocabulary, ``streaming.events``) as AG-UI events, each a Server-Sent Event.

One AG-UI run is a stretch of one of our runs: from its start, or from the decisions that resume
it, to its end or its next wait. The model's text and reasoning of each model call (each attempt:
a retried call is a new message) are a message; a tool call is announced when it runs, or when it
waits for a person, then its result; a wait is the AG-UI run's interrupt outcome. A child run's
events are not shown: its parent's tool call and result stand for it.
"""

from __future__ import annotations

import json
from typing import Any

from ag_ui.core import (
    BaseEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.core.events import (
    RunFinishedCancelledOutcome,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
)

WAITING = ": waiting\n\n"
"""What a ``run.waiting`` renders to (an SSE comment): the view then reads the run's open wait
points, to end the AG-UI run with all of them (a model call that asks two questions sends two
``run.waiting``), or goes on when they were decided meanwhile."""


def sse(event: BaseEvent) -> str:
    """One event as AG-UI's HTTP transport sends it: ``data: <camelCase JSON>``."""
    return f"data: {event.model_dump_json(by_alias=True, exclude_none=True)}\n\n"


class Translator:
    """Renders one of our runs' events (``views_stream.Render``) for one AG-UI run."""

    def __init__(
        self,
        thread_id: str,
        agui_run_id: str,
        decided: list[dict[str, Any]] | None = None,
        pause: list[dict[str, Any]] | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.agui_run_id = agui_run_id
        self.resumed = decided or []
        """The wait points this AG-UI run's resume decided (``streaming.serializers.decision_json``
        each, with its ``tool_call_id``)."""
        self.decided = frozenset(d["approval_id"] for d in self.resumed)
        # The client saw the pause's calls with their interrupts, and the results of the answered
        # ones (``started``, this resume's or an earlier one's): when the run goes on, an approved
        # call shows only its result, and an answered question nothing.
        paused = pause if pause is not None else self.resumed
        self.announced = {d["tool_call_id"] for d in paused if d["decision"] in ("approved", "answered")}
        self.answered = {d["tool_call_id"] for d in paused if d["decision"] == "answered"}
        self.text: str | None = None
        self.reasoning: str | None = None
        self.last_message: str | None = None
        self.finished = False

    def started(self) -> str:
        """The AG-UI run's start, then what its resume decided that runs nothing: a question's
        answer and a denied call are their calls' results."""
        out: list[BaseEvent] = [RunStartedEvent(thread_id=self.thread_id, run_id=self.agui_run_id)]
        for decided in self.resumed:
            if decided["decision"] == "answered":
                content = _text(decided.get("answer"))
            elif decided["decision"] != "approved":
                reason = decided.get("reason")
                content = f"Not run: {decided['decision']}" + (f" ({reason})" if reason else "")
            else:
                continue
            out.append(_result(decided["tool_call_id"], content))
        return "".join(sse(e) for e in out)

    def render(self, event: dict[str, Any], run_id: str) -> str:
        if self.finished:
            return ""
        kind = event.get("type")
        if kind == "run.waiting":
            # A child run's too: its approval stops its parent, and the AG-UI run ends with it.
            return "" if event.get("approval_id") in self.decided else WAITING
        if event.get("run_id") != run_id:
            return ""  # a child run's call and result are its parent's, already shown
        handler = _HANDLERS.get(kind or "")
        return "".join(sse(e) for e in handler(self, event, run_id)) if handler else ""

    # --- messages ------------------------------------------------------------------------------

    def _delta(self, event: dict[str, Any], run_id: str) -> list[BaseEvent]:
        text = event.get("text") or ""
        if not text:
            return []
        message = f"{run_id}-{event['step']}-{event['attempt']}"
        if event.get("kind") == "reasoning":
            out: list[BaseEvent] = self._close_text()
            if self.reasoning != message:
                out += self._close_reasoning()
                self.reasoning = message
                out += [
                    ReasoningStartEvent(message_id=f"{message}-r"),
                    ReasoningMessageStartEvent(message_id=f"{message}-r", role="reasoning"),
                ]
            return [*out, ReasoningMessageContentEvent(message_id=f"{message}-r", delta=text)]
        out = self._close_reasoning()
        if self.text != message:
            out += self._close_text()
            self.text = self.last_message = message
            out.append(TextMessageStartEvent(message_id=message, role="assistant"))
        return [*out, TextMessageContentEvent(message_id=message, delta=text)]

    def _close_text(self) -> list[BaseEvent]:
        if self.text is None:
            return []
        message, self.text = self.text, None
        return [TextMessageEndEvent(message_id=message)]

    def _close_reasoning(self) -> list[BaseEvent]:
        if self.reasoning is None:
            return []
        message, self.reasoning = f"{self.reasoning}-r", None
        return [ReasoningMessageEndEvent(message_id=message), ReasoningEndEvent(message_id=message)]

    def _step_end(self, event: dict[str, Any], run_id: str) -> list[BaseEvent]:
        return [*self._close_reasoning(), *self._close_text()]

    # --- tools ---------------------------------------------------------------------------------

    def call(self, tool_call_id: str, name: str, arguments: Any) -> list[BaseEvent]:
        """A tool call, announced whole: we stream a call's arguments only once they are complete."""
        return [
            *self._close_reasoning(),
            *self._close_text(),
            ToolCallStartEvent(
                tool_call_id=tool_call_id, tool_call_name=name, parent_message_id=self.last_message
            ),
            ToolCallArgsEvent(tool_call_id=tool_call_id, delta=json.dumps(arguments, ensure_ascii=False)),
            ToolCallEndEvent(tool_call_id=tool_call_id),
        ]

    def _tool_call(self, event: dict[str, Any], run_id: str) -> list[BaseEvent]:
        call = _call_id(event, run_id)
        if call in self.announced:
            self.announced.discard(call)  # once: a provider may use the id again later
            return [*self._close_reasoning(), *self._close_text()]
        return self.call(call, event["name"], event.get("input"))

    def _tool_result(self, event: dict[str, Any], run_id: str) -> list[BaseEvent]:
        call = _call_id(event, run_id)
        if call in self.answered:
            self.answered.discard(call)
            return []
        output = event.get("output")
        content = f"Error: {event['error']}" if event.get("error") else _text(output)
        return [_result(call, content)]

    # --- the end of this AG-UI run ---------------------------------------------------------------

    def interrupted(self, waits: list[dict[str, Any]]) -> str:
        """The AG-UI run's end at the run's open wait points (``streaming.serializers.waiting_event``
        each): their calls, then the interrupts that name them. None open any more (decided since):
        the view goes on following the run."""
        self.finished = True
        out: list[BaseEvent] = [*self._close_reasoning(), *self._close_text()]
        interrupts = []
        for wait in waits:
            call = wait.get("tool_call_id") or wait["approval_id"]
            out += self.call(call, wait["tool_name"], wait.get("input"))
            question = wait["kind"] == "input"
            interrupts.append(
                Interrupt(
                    id=wait["approval_id"],
                    reason="question" if question else "approval",
                    message=wait.get("question") if question else f"Approve {wait['tool_name']}?",
                    tool_call_id=call,
                    response_schema=(wait.get("answer_schema") or None) if question else APPROVAL_SCHEMA,
                    expires_at=wait.get("expires_at"),
                    metadata={
                        "tool_name": wait["tool_name"],
                        "editable": bool(wait.get("editable")),
                        # Not this AG-UI run's run when a run it delegated to asks.
                        "run_id": wait.get("run_id"),
                    },
                )
            )
        out.append(
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.agui_run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
            )
        )
        return "".join(sse(e) for e in out)

    def _end(self, event: dict[str, Any], run_id: str) -> list[BaseEvent]:
        self.finished = True
        out: list[BaseEvent] = [*self._close_reasoning(), *self._close_text()]
        usage = event.get("usage") or {}
        tokens = [
            TokenUsage(
                input_tokens=usage.get("input_tokens", 0),
                output_tokens=usage.get("output_tokens", 0),
                total_tokens=usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
            )
        ]
        status = event.get("status")
        if status == "failed":
            error = event.get("error") or {}
            return [
                *out,
                RunErrorEvent(
                    message=error.get("message") or "the run failed", code=error.get("code"), usage=tokens
                ),
            ]
        outcome = RunFinishedCancelledOutcome() if status == "cancelled" else RunFinishedSuccessOutcome()
        result = event.get("output") if status == "completed" else None
        return [
            *out,
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.agui_run_id,
                result=result,
                outcome=outcome,
                usage=tokens,
            ),
        ]

    def lost(self, message: str) -> str:
        """The AG-UI run's end when the run's events end without its own (the run is gone)."""
        self.finished = True
        return sse(RunErrorEvent(message=message, code="stream_ended"))


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string"},
        "arguments": {"type": "object", "description": "the call's arguments to run instead (if editable)"},
    },
    "required": ["approved"],
}
"""What resuming an approval takes as its payload (``inputs.decisions``)."""


def _result(call: str, content: str) -> ToolCallResultEvent:
    """A call's result: a tool message of its own, whose id follows from the call's."""
    return ToolCallResultEvent(message_id=f"{call}-result", tool_call_id=call, content=content, role="tool")


def _call_id(event: dict[str, Any], run_id: str) -> str:
    return event.get("tool_call_id") or f"{run_id}-{event['step']}"


def _text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


_HANDLERS = {
    "delta": Translator._delta,
    "step.end": Translator._step_end,
    "tool.call": Translator._tool_call,
    "tool.result": Translator._tool_result,
    "run.end": Translator._end,
}
