"""One execution of a run (SPEC §5): claim, load the start point, loop model -> tools -> save, settle.
The tool half of a step lives in ``tool_phase``.

The engine never saves a status itself: every write goes through ``store``, fenced by the claim.
No database transaction or row lock is held during a model call or a tool call, except the
transaction that records an effect tool together with its Django writes (see ``effects``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from . import queries, signals, store
from .agent import Agent, RunContext, registry
from .artifacts import ArtifactReader
from .broadcast import ChannelsBroadcaster
from .conf import conf
from .core.messages import open_tool_calls, trigger_message
from .core.states import TERMINAL, ErrorCode, Status
from .core.types import (
    NO_USAGE,
    Aborted,
    AbortSignal,
    Message,
    Model,
    ModelRequest,
    ModelTurn,
    Usage,
)
from .errors import AgentNotFound, ArtifactNotFound, LeaseLostError
from .faults import crash_point
from .lease import LeaseKeeper
from .lifecycle import announce_settled
from .models import Checkpoint, Run, Step
from .policy import policy
from .serializers import decision_json
from .store import Claim, StepRecord
from .tool_phase import CLOSED_BY, Settled, ToolPhase
from .tools import Tool

logger = logging.getLogger(__name__)

# How many settled runs of a thread are looked at, newest first, for one its creator may view.
HISTORY_CANDIDATES = 50


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def model() -> Model:
    return import_string(conf.MODEL)()


def execute(run_id: str, *, shutdown: AbortSignal | None = None, owner: str | None = None) -> str | None:
    """Claim ``run_id`` and execute it until it settles, waits or is aborted. Returns the status the
    execution left, or None when the run could not be claimed (a duplicate job is harmless)."""
    close_old_connections()
    claim = store.claim(run_id, owner or worker_identity(), float(conf.LEASE_SECONDS))
    if claim is None:
        return None
    crash_point("after_claim")
    return Execution(claim, shutdown).run()


class Execution(ToolPhase):
    def __init__(self, claim: Claim, shutdown: AbortSignal | None) -> None:
        self.claim = claim
        self.abort = AbortSignal()
        self.shutdown = shutdown
        self.run_row = Run.objects.get(pk=claim.run_id)
        self.broadcaster = ChannelsBroadcaster(self.run_row.thread)
        self.artifacts = ArtifactReader()
        self.invalid_streak = 0
        # Budgets count across executions: start from what earlier ones used.
        self.model_calls = self.run_row.model_calls
        self.tokens = self.run_row.input_tokens + self.run_row.output_tokens

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> str | None:
        unsubscribe = self.shutdown.on_set(lambda: self.abort.set("drain")) if self.shutdown else None
        keeper: LeaseKeeper | None = None
        try:
            if self.claim.cancel_requested:
                # Requested while the run was between executions (or a wait was opening): it wins.
                self.settle(Status.CANCELLED, close=CLOSED_BY["cancel"])
            if self.claim.stalled >= int(conf.MAX_ATTEMPTS):
                self.settle(
                    Status.FAILED,
                    error=(
                        ErrorCode.TOO_MANY_ATTEMPTS,
                        f"{self.claim.stalled} executions in a row ended without saving a step "
                        "(their worker died: a tool that crashes or exhausts the process?)",
                    ),
                    close=CLOSED_BY["failed"],
                )
            try:
                agent = registry.get(self.run_row.agent)
            except AgentNotFound as exc:
                return self.settle(Status.FAILED, error=(ErrorCode.AGENT_NOT_FOUND, str(exc)))
            deadline = agent.budget.deadline(time.monotonic())
            keeper = LeaseKeeper(self.claim, self.abort, deadline)
            keeper.start()
            if self.claim.resumed:
                decided = queries.resumed_decision(self.claim.run_id)
                extra = {"decision": decision_json(decided)} if decided is not None else {}
                self.emit("run.resume", status=Status.RUNNING, **extra)
            else:
                self.emit("run.start", status=Status.RUNNING)
            signals.run_started.send(
                Run, run=self.run_row, resumed=self.claim.resumed, attempt=self.claim.attempt
            )
            return self.loop(agent)
        except Settled as settled:
            return settled.status
        except LeaseLostError as exc:
            logger.warning("run %s: %s", self.claim.run_id, exc)
            signals.execution_error.send(Run, run_id=self.claim.run_id, error=exc)
            return None
        except (OperationalError, InterfaceError) as exc:
            # The database went away: nothing can be written, and nothing is wrong with the run.
            # Its lease expires and chamvi_tick hands it to a worker that can reach the database.
            logger.warning("run %s: database unavailable (%s); left for recovery", self.claim.run_id, exc)
            signals.execution_error.send(Run, run_id=self.claim.run_id, error=exc)
            return None
        except Exception as exc:
            logger.exception("run %s: execution crashed", self.claim.run_id)
            signals.execution_error.send(Run, run_id=self.claim.run_id, error=exc)
            # Viewers get a stable code and a message without internals; the log has the traceback.
            message = f"an internal error stopped the run ({type(exc).__name__}); the worker log has details"
            try:
                return self.settle(Status.FAILED, error=(ErrorCode.INTERNAL_ERROR, message))
            except Settled as settled:
                return settled.status
            except Exception:
                # The database is unreachable: the lease expires and chamvi_tick recovers the run.
                logger.exception("run %s: could not settle after a crash", self.claim.run_id)
                return None
        finally:
            if keeper is not None:
                keeper.stop()
            if unsubscribe:
                unsubscribe()
            self.broadcaster.flush()

    def emit(self, type_: str, **fields: Any) -> None:
        self.broadcaster.publish(self.claim.run_id, {"type": type_, **fields})

    def settle(
        self,
        status: Status,
        *,
        output: Any = None,
        error: tuple[str, str] | None = None,
        close: str | None = None,
    ) -> str:
        code, message = error or ("", "")
        crash_point("before_settle")
        try:
            settled = store.settle(
                self.claim, status, output=output, error_code=code, error_message=message, close_history=close
            )
        except store.CancelRequested:
            status = Status.CANCELLED
            settled = store.settle(self.claim, status, close_history=CLOSED_BY["cancel"])
        if not settled:
            raise LeaseLostError(f"run {self.claim.run_id}: claim lost before settling")
        announce_settled(self.claim.run_id, self.broadcaster)
        raise Settled(status)

    def stop_if_aborted(self) -> None:
        reason = self.abort.reason if self.abort.is_set() else None
        if reason is None:
            return
        if reason == "lease_lost":
            raise LeaseLostError(f"run {self.claim.run_id}: lease lost")
        if reason == "drain":
            self.settle(Status.INTERRUPTED)
        if reason == "timeout":
            self.settle(
                Status.FAILED,
                error=(ErrorCode.TIMEOUT, "the execution ran out of time"),
                close=CLOSED_BY["timeout"],
            )
        self.settle(Status.CANCELLED, close=CLOSED_BY["cancel"])

    # --- the loop ----------------------------------------------------------------------------

    def start_point(self) -> tuple[list[Message], int]:
        checkpoint = Checkpoint.objects.filter(run_id=self.claim.run_id).first()
        if checkpoint is not None:
            return list(checkpoint.messages), checkpoint.step_index + 1
        trigger = self.run_row.trigger
        history = self.thread_history() if self.run_row.thread else []
        first = trigger_message(
            trigger.get("source", "api"),
            trigger.get("trigger", "api"),
            trigger.get("payload"),
            trigger.get("attachments"),
        )
        return [*history, first], 0

    def thread_history(self) -> list[Message]:
        """The latest settled history of the thread that this run's creator may view: a run never
        receives a conversation its creator could not read (SPEC §3)."""
        creator = self.run_row.created_by
        earlier = (
            Checkpoint.objects.filter(
                run__thread=self.run_row.thread,
                run__status__in=[s.value for s in TERMINAL],
                run__created_at__lt=self.run_row.created_at,
            )
            .select_related("run")
            .order_by("-run__created_at")
        )
        if creator is None:
            earlier = earlier.filter(run__created_by__isnull=True)
        for checkpoint in earlier[:HISTORY_CANDIDATES]:
            if creator is None or policy().can_view(creator, checkpoint.run):
                return list(checkpoint.messages)
        return []

    def loop(self, agent: Agent) -> str:
        ctx = RunContext(run=self.run_row, agent=agent, abort=self.abort)
        messages, index = self.start_point()
        tools = agent.assemble_tools(ctx)
        if open_tool_calls(messages):
            messages, index = self.resume_calls(agent, tools, messages, index)
        elif index > 0:
            self.settle_saved_ending(agent, messages)
        while True:
            self.stop_if_aborted()
            if agent.budget.steps_exhausted(self.model_calls):
                self.fail_budget(f"max_steps={agent.budget.max_steps} model calls used")
            if agent.budget.tokens_exhausted(self.tokens):
                self.fail_budget(f"max_tokens={agent.budget.max_tokens} tokens used")
            inputs = queries.pending_inputs(self.claim.run_id)
            for item in inputs:
                messages.append({"role": "user", "content": _input_text(item.payload)})
                # Shown where the model takes it: before the call of step ``index``. An aborted call
                # saves nothing, and the next execution announces the same input again.
                self.emit("input", step=index, input_id=item.pk, payload=item.payload)
            messages, index = self.model_step(agent, ctx, tools, messages, index, [i.pk for i in inputs])

    def settle_saved_ending(self, agent: Agent, messages: list[Message]) -> None:
        """An earlier execution saved a step that ended the run, then died before settling: settle
        as it would have, without calling the model again (its step is not the one in flight)."""
        if (
            not messages
            or messages[-1].get("role") != "assistant"
            or queries.pending_inputs(self.claim.run_id)
        ):
            return
        last = Step.objects.filter(run_id=self.claim.run_id, kind="llm").order_by("-index").first()
        if last is None:
            return
        finish = (last.output or {}).get("finish_reason")
        if finish == "error":
            self.settle(Status.FAILED, error=(ErrorCode.MODEL_ERROR, last.error))
        if finish is None:
            self.settle(Status.FAILED, error=(ErrorCode.INCOMPLETE_RESPONSE, last.error))
        try:
            output = agent.parse_output(messages[-1].get("content") or "")
        except ValueError as exc:
            self.settle(Status.FAILED, error=(ErrorCode.INVALID_OUTPUT, str(exc)))
        self.settle(Status.COMPLETED, output=output)

    def fail_budget(self, detail: str) -> None:
        self.settle(Status.FAILED, error=(ErrorCode.BUDGET_EXCEEDED, detail), close=CLOSED_BY["failed"])

    def request(
        self, agent: Agent, ctx: RunContext, tools: dict[str, Tool], messages: list[Message]
    ) -> ModelRequest:
        system = agent.render_instructions(ctx)
        try:
            hydrated = self.artifacts.hydrate(messages)
        except ArtifactNotFound as exc:
            self.settle(
                Status.FAILED, error=(ErrorCode.ARTIFACT_NOT_FOUND, str(exc)), close=CLOSED_BY["failed"]
            )
        prefix: list[Message] = [{"role": "system", "content": system}] if system else []
        return ModelRequest(
            model=agent.model,
            messages=prefix + hydrated,
            tools=[t.schema() for t in tools.values()],
            response_format=agent.response_format(),
        )

    def model_step(
        self,
        agent: Agent,
        ctx: RunContext,
        tools: dict[str, Tool],
        messages: list[Message],
        index: int,
        inputs: list[str],
    ) -> tuple[list[Message], int]:
        request = self.request(agent, ctx, tools, messages)
        attempt = self.claim.attempt
        # Counted before it is made: a call whose execution dies unsaved still uses the budget.
        if not store.count_model_call(self.claim):
            raise LeaseLostError(f"run {self.claim.run_id}: claim lost before a model call")
        self.model_calls += 1
        started = timezone.now()
        self.emit("step.start", step=index, attempt=attempt)

        def on_delta(kind: str, text: str) -> None:
            self.emit("delta", step=index, attempt=attempt, kind=kind, text=text)
            crash_point("mid_stream")
            signals.run_delta.send(
                Run, run_id=self.claim.run_id, step=index, attempt=attempt, kind=kind, text=text
            )

        try:
            turn = model().stream(request, on_delta, self.abort)
        except Aborted:
            # The model call is abandoned: no step is written for it.
            self.stop_if_aborted()
            raise
        self.tokens += turn.usage.total
        finish = turn.finish_reason if turn.error is None else "error"
        llm = StepRecord(
            index=index,
            kind="llm",
            name=agent.model,
            started_at=started,
            input={"messages": len(request.messages), "inputs": inputs},
            output=_turn_output(turn, finish),
            error=turn.error or "",
        )
        if turn.error is not None or turn.finish_reason is None:
            return self.fail_turn(turn, llm, messages, inputs)
        self.emit("step.end", step=index, attempt=attempt, finish_reason=finish)
        if turn.tool_calls:
            # The lease keeper checks only every heartbeat: a worker that froze during the stream
            # learns here, before any tool runs, that another worker may hold the run now. The
            # call's usage is recorded with it: a tool that kills the worker must not make the
            # repeated call free.
            if not store.renew(self.claim, float(conf.LEASE_SECONDS), usage=turn.usage):
                raise LeaseLostError(f"run {self.claim.run_id}: lease lost before running tools")
            messages = [*messages, turn.assistant_message()]
            steps = [llm]
            calls = [c.as_message_part() for c in turn.tool_calls]
            messages, steps = self.answer_calls(
                agent, tools, calls, messages, steps, llm_index=index, inputs=inputs
            )
            self.save_model_step(steps, messages, NO_USAGE, inputs)
            self.after_tools(agent, steps)
            return messages, steps[-1].index + 1
        messages = [*messages, turn.assistant_message()]
        self.save_model_step([llm], messages, turn.usage, inputs)
        if queries.pending_inputs(self.claim.run_id):
            # Input arrived while the model answered: it gets another turn to take it into account.
            return messages, index + 1
        try:
            output = agent.parse_output(turn.text)
        except ValueError as exc:
            self.settle(Status.FAILED, error=(ErrorCode.INVALID_OUTPUT, str(exc)))
        self.settle(Status.COMPLETED, output=output)
        raise AssertionError("unreachable")

    def save_model_step(
        self, steps: list[StepRecord], messages: list[Message], usage: Usage, inputs: list[str]
    ) -> None:
        """Steps, checkpoint and (unless already recorded) usage of one model call, in one
        transaction. The budget counters are kept in memory: this execution is the run's only
        writer while it holds the claim."""
        finish = steps[0].output["finish_reason"]  # steps[0] is the model call's llm step
        store.save_step(
            self.claim, steps, messages, finish_reason=finish or "", usage=usage, consumed_inputs=inputs
        )
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)

    def fail_turn(self, turn: ModelTurn, llm: StepRecord, messages: list[Message], inputs: list[str]) -> Any:
        # The text so far is kept; tool calls of a broken turn never run.
        if turn.error is None:
            llm.error = "the stream ended without a finish reason"
            code, detail = ErrorCode.INCOMPLETE_RESPONSE, llm.error
        else:
            code, detail = ErrorCode.MODEL_ERROR, turn.error
        self.save_model_step(
            [llm], [*messages, turn.assistant_message(with_tool_calls=False)], turn.usage, inputs
        )
        self.emit(
            "step.end", step=llm.index, attempt=self.claim.attempt, finish_reason=llm.output["finish_reason"]
        )
        self.settle(Status.FAILED, error=(code, detail))


def _turn_output(turn: ModelTurn, finish: str | None) -> dict[str, Any]:
    return {
        "text": turn.text,
        "reasoning": turn.reasoning,
        "tool_calls": [c.as_message_part() for c in turn.tool_calls],
        "finish_reason": finish,
        "usage": {"input_tokens": turn.usage.input_tokens, "output_tokens": turn.usage.output_tokens},
    }


def _input_text(payload: Any) -> str:
    import json

    return payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)


__all__ = ["Execution", "execute", "worker_identity"]
