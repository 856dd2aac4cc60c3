"""One turn of an execution's loop (SPEC §5): the gates before a model call (an abort, the budgets),
the call counted and the steering input it takes, the request, the stream (each delta an event),
the ``llm`` step, then the call's tools, saved with it, or its final answer, which settles the run.

A turn returns where the loop stands next (``Position``), or how the execution ended
(``core.endings``). It writes through ``fenced_writes.FencedWrites`` only.
"""

from __future__ import annotations

from collections.abc import Callable

from django.utils import timezone
from django.utils.module_loading import import_string

from .. import signals
from ..agents.agent import Agent, RunContext
from ..conf import conf
from ..core import decisions
from ..core.decisions import Settle, Turn
from ..core.endings import Ending
from ..core.faults import crash_point
from ..core.messages import input_message
from ..core.ports import Model, Store
from ..core.records import Claim, StepRecord, llm_step_output
from ..core.states import ErrorCode, Status
from ..core.types import NO_USAGE, Aborted, AbortSignal, Message, ModelRequest, ModelTurn
from ..errors import ArtifactNotFound
from ..models import Run
from ..streaming import events
from .artifacts import ArtifactReader
from .fenced_writes import FencedWrites
from .tool_calls import ToolCalls

Position = tuple[list[Message], int]
"""Where the loop stands: the history, and the index of its next step."""


def model(agent: Agent) -> Model:
    """The agent's model adapter: ``MODEL`` (Chat Completions), or ``RESPONSES_MODEL``."""
    path = conf.RESPONSES_MODEL if agent.model_api == "responses" else conf.MODEL
    factory: Callable[[], Model] = import_string(path)
    return factory()


class ModelSteps:
    """The model steps of one execution. Budgets count across executions: the counters start from
    what earlier ones used; the invalid-call streak is this execution's."""

    def __init__(
        self,
        claim: Claim,
        run: Run,
        abort: AbortSignal,
        db: Store,
        writes: FencedWrites,
        emit: Callable[[events.Event], None],
    ) -> None:
        self.claim = claim
        self.abort = abort
        self.db = db
        self.writes = writes
        self.emit = emit
        self.artifacts = ArtifactReader()
        self.model_calls = run.model_calls
        self.tokens = run.input_tokens + run.output_tokens
        self.invalid_streak = 0

    def take(
        self, agent: Agent, ctx: RunContext, calls: ToolCalls, messages: list[Message], index: int
    ) -> Position | Ending:
        # A call the last save counted passed the budgets before it was counted.
        counted = self.writes.counted is not None
        gate = None if counted else decisions.budget_gate(agent.budget, self.model_calls, self.tokens)
        ending = self.writes.stop_if_aborted(self.abort) or self.writes.carry_out(gate)
        if ending is not None:
            return ending
        inputs = self.writes.start_model_call()
        if isinstance(inputs, Ending):
            return inputs
        if not counted:
            self.model_calls += 1
        for item in inputs:
            messages.append(input_message(item.payload))
            # Shown where the model takes it: before the call of step ``index``. An aborted call
            # saves nothing, and the next execution announces the same input again.
            self.emit(events.input_taken(step=index, input_id=item.pk, payload=item.payload))
        return self.call(agent, ctx, calls, messages, index, [i.pk for i in inputs])

    def request(
        self, agent: Agent, ctx: RunContext, calls: ToolCalls, messages: list[Message]
    ) -> ModelRequest | Ending:
        system = agent.render_instructions(ctx)
        try:
            hydrated = self.artifacts.hydrate(messages)
        except ArtifactNotFound as exc:
            return self.writes.settle(
                Settle(Status.FAILED, (ErrorCode.ARTIFACT_NOT_FOUND, str(exc)), decisions.CLOSED_BY["failed"])
            )
        prefix: list[Message] = [{"role": "system", "content": system}] if system else []
        return ModelRequest(
            model=agent.model,
            messages=prefix + hydrated,
            tools=[t.schema() for t in calls.tools.values()],
            response_format=agent.response_format(),
        )

    def call(
        self,
        agent: Agent,
        ctx: RunContext,
        calls: ToolCalls,
        messages: list[Message],
        index: int,
        inputs: list[str],
    ) -> Position | Ending:
        request = self.request(agent, ctx, calls, messages)
        if isinstance(request, Ending):
            return request
        attempt = self.claim.attempt
        started = timezone.now()
        self.emit(events.step_start(step=index, attempt=attempt))

        def on_delta(kind: str, text: str) -> None:
            self.emit(events.delta(step=index, attempt=attempt, kind=kind, text=text))
            crash_point("mid_stream")
            signals.run_delta.send(
                Run, run_id=self.claim.run_id, step=index, attempt=attempt, kind=kind, text=text
            )

        # Nothing is written until the call returns: a pooled connection serves others meanwhile.
        self.db.hand_back()
        try:
            turn = model(agent).stream(request, on_delta, self.abort)
        except Aborted:
            # The model call is abandoned: no step is written for it.
            ending = self.writes.stop_if_aborted(self.abort)
            if ending is None:
                raise
            return ending
        self.tokens += turn.usage.total
        finish = decisions.finish_reason(turn)
        llm = StepRecord(
            index=index,
            kind="llm",
            name=agent.model,
            started_at=started,
            # The call's end, not the write's: that comes after the call's tools have run.
            finished_at=timezone.now(),
            # The version of the agent that made the call: every execution says what it ran.
            input={"messages": len(request.messages), "inputs": inputs, "version": agent.version},
            output=llm_step_output(turn, finish),
            error=turn.error or "",
        )
        kind = decisions.classify(turn)
        if kind is Turn.BROKEN:
            return self.fail(turn, llm, messages, inputs)
        self.emit(events.step_end(step=index, attempt=attempt, finish_reason=finish))
        messages = [*messages, turn.assistant_message()]
        if kind is Turn.TOOLS:
            return self.run_tools(agent, calls, turn, llm, messages, inputs)
        try:
            output, decision = agent.parse_output(turn.text), Settle(Status.COMPLETED)
        except ValueError as exc:
            output, decision = None, Settle(Status.FAILED, (ErrorCode.INVALID_OUTPUT, str(exc)))
        # Input that arrived while the model answered gets another turn to take it into account.
        ending = self.writes.conclude(
            [llm], messages, turn.usage, inputs, decision, output, unless_input=True
        )
        return ending if ending is not None else (messages, index + 1)

    def run_tools(
        self,
        agent: Agent,
        calls: ToolCalls,
        turn: ModelTurn,
        llm: StepRecord,
        messages: list[Message],
        inputs: list[str],
    ) -> Position | Ending:
        """The model call asked for tools: they run, then the call is saved with them (or with the
        wait the first that needs a person opens)."""
        ending = self.writes.renew(turn.usage)
        if ending is not None:
            return ending
        parts = [c.as_message_part() for c in turn.tool_calls]
        answered = calls.answer(parts, messages, [llm], llm_index=llm.index)
        if answered.waits:
            return self.writes.open_wait(agent, answered, usage=NO_USAGE, inputs=inputs)
        self.invalid_streak = decisions.invalid_streak(self.invalid_streak, answered.steps)
        gate = decisions.streak_gate(self.invalid_streak, conf.MAX_INVALID_TOOL_CALLS)
        budget = decisions.budget_gate(agent.budget, self.model_calls, self.tokens)
        if gate is None and budget is None and not self.abort.is_set():
            # The next call follows at once: it is counted with this save.
            ending = self.writes.save_and_count(answered.steps, answered.messages, inputs=inputs)
            if ending is not None:
                return ending
            self.model_calls += 1
            return answered.messages, answered.steps[-1].index + 1
        ending = self.writes.save(answered.steps, answered.messages, inputs=inputs) or self.writes.carry_out(
            gate
        )
        return ending if ending is not None else (answered.messages, answered.steps[-1].index + 1)

    def fail(self, turn: ModelTurn, llm: StepRecord, messages: list[Message], inputs: list[str]) -> Ending:
        """A broken turn: the text so far is kept; its tool calls never run."""
        llm.error, decision = decisions.broken(turn)
        finish = llm.output["finish_reason"]
        self.emit(events.step_end(step=llm.index, attempt=self.claim.attempt, finish_reason=finish))
        history = [*messages, turn.assistant_message(with_tool_calls=False)]
        ending = self.writes.conclude([llm], history, turn.usage, inputs, decision)
        if ending is None:
            raise AssertionError("a broken turn settles the run")
        return ending
