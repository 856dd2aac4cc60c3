"""One execution of a run (SPEC §5): claim, load the start point, loop model -> tools -> save, settle.

The engine interprets the decisions of ``core.decisions`` and carries them out: it reads and
writes run state only through the store (``core.ports.Store``), runs a model call's tools through
``tool_calls.ToolCalls``, and announces what happened on signals and the broadcaster. No database
transaction or row lock is held during a model call or a tool call, except the transaction that
records an effect tool together with its Django writes (see ``effects``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import signals, store
from ..agents.agent import Agent, RunContext, registry
from ..agents.tools import Tool
from ..conf import conf
from ..core import decisions, log_context
from ..core.decisions import ABANDON, FINISH, Marker, Settle, Turn
from ..core.faults import crash_point
from ..core.messages import input_message, last_assistant, open_tool_calls
from ..core.ports import Broadcaster, Model, Store
from ..core.records import Claim, Opening, StepRecord, Stored, llm_step_output
from ..core.states import TERMINAL, ErrorCode, Status
from ..core.types import NO_USAGE, Aborted, AbortSignal, Message, ModelRequest, ModelTurn, Usage
from ..errors import AgentNotFound, ArtifactNotFound, HistoryUnavailable, LeaseLostError
from ..models import Run
from ..streaming.broadcast import ChannelsBroadcaster
from ..streaming.serializers import decision_json, start_lineage, waiting_event
from .artifacts import ArtifactReader
from .lease_keeper import Lease, keeper
from .lifecycle import announce_settled
from .notifications import notify
from .start_point import start_point
from .tool_calls import Answered, ToolCalls

logger = logging.getLogger(__name__)

STORE: Store = store
"""The Django store, checked against the port by mypy."""


class Settled(Exception):
    """Internal: the execution has written its final status (or its wait)."""

    def __init__(self, status: str) -> None:
        self.status = status


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def model() -> Model:
    factory: Callable[[], Model] = import_string(conf.MODEL)
    return factory()


def execute(run_id: str, *, shutdown: AbortSignal | None = None, owner: str | None = None) -> str | None:
    """Claim ``run_id`` and execute it until it settles, waits or is aborted. Returns the status the
    execution left, or None when the run could not be claimed (a duplicate job is harmless)."""
    close_old_connections()
    claim = STORE.claim(run_id, owner or worker_identity(), conf.LEASE_SECONDS)
    if claim is None:
        return None
    crash_point("after_claim")
    return Execution(claim, shutdown).run()


class Execution:
    def __init__(self, claim: Claim, shutdown: AbortSignal | None, db: Store = STORE) -> None:
        self.claim = claim
        self.db = db
        self.abort = AbortSignal()
        self.shutdown = shutdown
        self.run_row: Run = db.run(claim.run_id)
        self.broadcaster: Broadcaster = ChannelsBroadcaster(self.run_row.thread, self.run_row.scope)
        self.artifacts = ArtifactReader()
        self.invalid_streak = 0
        self.lease: Lease | None = None
        # What of the history is stored (``store.histories``): how many messages, whether this
        # execution saved yet (its first save writes the whole history), and until the run's first
        # save, the history it opens with.
        self.stored_length = 0
        self.saved_once = False
        self.opening: Opening | None = None
        # Budgets count across executions: start from what earlier ones used.
        self.model_calls = self.run_row.model_calls
        self.tokens = self.run_row.input_tokens + self.run_row.output_tokens

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> str | None:
        # Every record logged while this thread executes the run names it (``chamvi_runs.logs``).
        with log_context.bound(log_context.of(self.claim)):
            return self._run()

    def _run(self) -> str | None:
        unsubscribe = self.shutdown.on_set(lambda: self.abort.set("drain")) if self.shutdown else None
        try:
            self.carry_out(decisions.on_claim(self.claim, conf.MAX_ATTEMPTS))
            try:
                agent = registry.get(self.run_row.agent)
            except AgentNotFound as exc:
                self.settle(Settle(Status.FAILED, (ErrorCode.AGENT_NOT_FOUND, str(exc))))
            self.lease = keeper.keep(self.claim, self.abort, agent.budget.deadline(time.monotonic()), self.db)
            decided = None
            if self.claim.resumed:
                decided = self.db.resumed_decision(self.claim.run_id)
                extra = {"decision": decision_json(decided)} if decided is not None else {}
                self.emit("run.resume", status=Status.RUNNING, **extra)
            else:
                self.emit("run.start", status=Status.RUNNING, **start_lineage(self.run_row))
            signals.run_started.send(
                Run,
                run=self.run_row,
                resumed=self.claim.resumed,
                attempt=self.claim.attempt,
                decision=decided,
            )
            self.loop(agent)
        except Settled as settled:
            return settled.status
        except LeaseLostError as exc:
            logger.warning("%s", exc)  # the message names the run
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
                self.settle(Settle(Status.FAILED, (ErrorCode.INTERNAL_ERROR, message)))
            except Settled as settled:
                return settled.status
            except Exception:
                # The database is unreachable: the lease expires and chamvi_tick recovers the run.
                logger.exception("run %s: could not settle after a crash", self.claim.run_id)
                return None
        finally:
            if self.lease is not None:
                self.lease.stop()
            if unsubscribe:
                unsubscribe()
            self.broadcaster.flush()
        raise AssertionError("an execution ends by settling, waiting or losing its claim")

    def emit(self, type_: str, **fields: Any) -> None:
        self.broadcaster.publish(self.claim.run_id, {"type": type_, **fields})

    def carry_out(self, decision: Settle | Marker | None, output: Any = None) -> None:
        """Carry out a decision of ``core.decisions``: None goes on; anything else ends the execution."""
        if decision is None:
            return
        if decision is ABANDON:
            raise LeaseLostError(f"run {self.claim.run_id}: lease lost")
        assert isinstance(decision, Settle)
        self.settle(decision, output)

    def settle(self, decision: Settle, output: Any = None) -> NoReturn:
        code, message = decision.error or ("", "")
        crash_point("before_settle")
        status = decision.status
        settled = self.db.settle(
            self.claim,
            status,
            output=output,
            error_code=code,
            error_message=message,
            close_history=decision.close,
        )
        if not settled and status not in TERMINAL:
            # Refused: a requested cancel wins over ``interrupted`` (or the claim is lost, and the
            # cancel is refused too).
            instead = decisions.on_refused_wait()
            status = instead.status
            settled = self.db.settle(self.claim, status, close_history=instead.close)
        if not settled:
            raise LeaseLostError(f"run {self.claim.run_id}: claim lost before settling")
        self.announce(status)

    def announce(self, status: Status) -> NoReturn:
        """After the settle's commit: its announcement, and the end of the execution."""
        if self.lease is not None:
            self.lease.stop()  # nothing is left to renew or cancel
        announce_settled(self.claim.run_id, self.broadcaster)
        raise Settled(status)

    def finish(self, agent: Agent, text: str) -> NoReturn:
        try:
            output = agent.parse_output(text)
        except ValueError as exc:
            self.settle(Settle(Status.FAILED, (ErrorCode.INVALID_OUTPUT, str(exc))))
        self.settle(Settle(Status.COMPLETED), output)

    def stop_if_aborted(self) -> None:
        self.carry_out(decisions.on_abort(self.abort.reason if self.abort.is_set() else None))

    # --- the loop ----------------------------------------------------------------------------

    def loop(self, agent: Agent) -> NoReturn:
        ctx = RunContext(run=self.run_row, agent=agent, abort=self.abort)
        try:
            messages, index, self.opening = start_point(self.db, self.run_row, resumed=self.claim.resumed)
        except HistoryUnavailable as exc:
            self.settle(Settle(Status.FAILED, (ErrorCode.HISTORY_UNAVAILABLE, str(exc))))
        self.stored_length = len(self.opening.messages) if self.opening is not None else len(messages)
        tools = agent.assemble_tools(ctx)
        calls = ToolCalls(self.claim, self.abort, self.run_row, agent, tools, self.emit)
        if open_tool_calls(messages):
            messages, index = self.resume_calls(agent, calls, messages, index)
        elif index > 0:
            self.settle_saved_ending(agent, messages)
        while True:
            self.stop_if_aborted()
            self.carry_out(decisions.budget_gate(agent.budget, self.model_calls, self.tokens))
            # Counted before it is made: a call whose execution dies unsaved still uses the budget.
            inputs = self.db.start_model_call(self.claim)
            if inputs is None:
                raise LeaseLostError(f"run {self.claim.run_id}: claim lost before a model call")
            self.model_calls += 1
            for item in inputs:
                messages.append(input_message(item.payload))
                # Shown where the model takes it: before the call of step ``index``. An aborted call
                # saves nothing, and the next execution announces the same input again.
                self.emit("input", step=index, input_id=item.pk, payload=item.payload)
            messages, index = self.model_step(agent, ctx, calls, messages, index, [i.pk for i in inputs])

    def settle_saved_ending(self, agent: Agent, messages: list[Message]) -> None:
        """An earlier execution saved a step that ended the run, then died before settling."""
        last = self.db.last_model_step(self.claim.run_id)
        decision = decisions.saved_ending(
            messages[-1].get("role") if messages else None,
            bool(self.db.pending_inputs(self.claim.run_id)),
            (last.output or {}).get("finish_reason") if last is not None else None,
            last.error if last is not None else "",
            last is not None,
        )
        if decision is FINISH:
            self.finish(agent, messages[-1].get("content") or "")
        self.carry_out(decision)

    def resume_calls(
        self, agent: Agent, calls: ToolCalls, messages: list[Message], index: int
    ) -> tuple[list[Message], int]:
        """The checkpoint ends on tool calls without results: an approval was asked for. Undecided:
        back to waiting, no model call. Decided: the approved call runs, then the calls after it."""
        last = self.db.last_model_step(self.claim.run_id, before=index)
        llm_index = last.index if last is not None else 0
        open_calls = open_tool_calls(messages)
        # Calls are answered in order: the open ones are the last of their model call's calls.
        first_position = len(last_assistant(messages).get("tool_calls") or []) - len(open_calls)
        if self.db.waiting_at(self.claim.run_id, llm_index, first_position):
            if not self.db.back_to_waiting(self.claim):
                self.settle(decisions.on_refused_wait())
            raise Settled(Status.WAITING)
        answered = calls.answer(
            open_calls,
            messages,
            [],
            llm_index=llm_index,
            first_position=first_position,
            next_index=index,
            decided=self.db.decided_calls(self.claim.run_id, llm_index),
        )
        if answered.waits:
            self.open_wait(agent, answered, usage=NO_USAGE, inputs=())
        if answered.steps:
            self.save(answered.steps, answered.messages)
            return answered.messages, answered.steps[-1].index + 1
        return answered.messages, index

    def request(
        self, agent: Agent, ctx: RunContext, tools: dict[str, Tool], messages: list[Message]
    ) -> ModelRequest:
        system = agent.render_instructions(ctx)
        try:
            hydrated = self.artifacts.hydrate(messages)
        except ArtifactNotFound as exc:
            self.settle(
                Settle(Status.FAILED, (ErrorCode.ARTIFACT_NOT_FOUND, str(exc)), decisions.CLOSED_BY["failed"])
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
        calls: ToolCalls,
        messages: list[Message],
        index: int,
        inputs: list[str],
    ) -> tuple[list[Message], int]:
        request = self.request(agent, ctx, calls.tools, messages)
        attempt = self.claim.attempt
        started = timezone.now()
        self.emit("step.start", step=index, attempt=attempt)

        def on_delta(kind: str, text: str) -> None:
            self.emit("delta", step=index, attempt=attempt, kind=kind, text=text)
            crash_point("mid_stream")
            signals.run_delta.send(
                Run, run_id=self.claim.run_id, step=index, attempt=attempt, kind=kind, text=text
            )

        # Nothing is written until the call returns: a pooled connection serves others meanwhile.
        self.db.hand_back()
        try:
            turn = model().stream(request, on_delta, self.abort)
        except Aborted:
            # The model call is abandoned: no step is written for it.
            self.stop_if_aborted()
            raise
        self.tokens += turn.usage.total
        finish = decisions.finish_reason(turn)
        llm = StepRecord(
            index=index,
            kind="llm",
            name=agent.model,
            started_at=started,
            # The call's end, not the write's: that comes after the call's tools have run.
            finished_at=timezone.now(),
            input={"messages": len(request.messages), "inputs": inputs},
            output=llm_step_output(turn, finish),
            error=turn.error or "",
        )
        kind = decisions.classify(turn)
        if kind is Turn.BROKEN:
            self.fail_turn(turn, llm, messages, inputs)
        self.emit("step.end", step=index, attempt=attempt, finish_reason=finish)
        messages = [*messages, turn.assistant_message()]
        if kind is Turn.TOOLS:
            # The lease keeper checks only every heartbeat: a worker that froze during the stream
            # learns here, before any tool runs, that another worker may hold the run now. The
            # call's usage is recorded with it: a tool that kills the worker must not make the
            # repeated call free.
            if not self.db.renew(self.claim, conf.LEASE_SECONDS, usage=turn.usage):
                raise LeaseLostError(f"run {self.claim.run_id}: lease lost before running tools")
            parts = [c.as_message_part() for c in turn.tool_calls]
            answered = calls.answer(parts, messages, [llm], llm_index=index)
            if answered.waits:
                self.open_wait(agent, answered, usage=NO_USAGE, inputs=inputs)
            self.save(answered.steps, answered.messages, inputs=inputs)
            self.invalid_streak = decisions.invalid_streak(self.invalid_streak, answered.steps)
            self.carry_out(decisions.streak_gate(self.invalid_streak, conf.MAX_INVALID_TOOL_CALLS))
            return answered.messages, answered.steps[-1].index + 1
        try:
            output, decision = agent.parse_output(turn.text), Settle(Status.COMPLETED)
        except ValueError as exc:
            output, decision = None, Settle(Status.FAILED, (ErrorCode.INVALID_OUTPUT, str(exc)))
        # Input that arrived while the model answered gets another turn to take it into account.
        self.conclude([llm], messages, turn.usage, inputs, decision, output, unless_input=True)
        return messages, index + 1

    def save(
        self,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        usage: Usage = NO_USAGE,
        inputs: Sequence[str] = (),
    ) -> None:
        """Steps, checkpoint and (unless already recorded) usage of one model call, in one
        transaction. The budget counters are kept in memory: this execution is the run's only
        writer while it holds the claim."""
        if not self.db.save_step(
            self.claim,
            steps,
            messages,
            finish_reason=_finish_reason(steps),
            usage=usage,
            consumed_inputs=inputs,
            stored=self.stored(),
        ):
            raise LeaseLostError(f"run {self.claim.run_id}: claim lost before saving steps")
        self.saved(messages)
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)

    def stored(self) -> Stored:
        """What the next save finds stored of the history (see ``store.histories``)."""
        opening = self.opening
        return Stored(
            self.stored_length,
            whole=not self.saved_once,
            opening_length=len(opening.messages) if opening is not None else None,
        )

    def saved(self, messages: list[Message]) -> None:
        self.stored_length, self.saved_once, self.opening = len(messages), True, None

    def open_wait(self, agent: Agent, answered: Answered, *, usage: Usage, inputs: Sequence[str]) -> NoReturn:
        """Calls wait for a person: their wait steps, the steps so far and the wait points, at once."""
        steps, messages = answered.steps, answered.messages
        waits = answered.wait_steps
        waitpoints = self.db.open_wait(
            self.claim,
            [*steps, *waits],
            messages,
            waits=answered.waits,
            usage=usage,
            consumed_inputs=inputs,
            stored=self.stored(),
        )
        if waitpoints is None:
            # The cancel came while the model answered: it wins over the wait. What the step did
            # is kept, and the open calls are answered as cancelled.
            if steps:
                self.save(steps, messages, usage=usage, inputs=inputs)
            self.settle(decisions.on_refused_wait())
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=[*steps, *waits])
        for waitpoint in waitpoints:
            self.emit("run.waiting", **waiting_event(waitpoint))
        run = self.db.run(self.claim.run_id)
        for waitpoint in waitpoints:
            signals.run_waiting.send(Run, run=run, waitpoint=waitpoint)
            notify(agent, run, waitpoint)
        raise Settled(Status.WAITING)

    def fail_turn(
        self, turn: ModelTurn, llm: StepRecord, messages: list[Message], inputs: list[str]
    ) -> NoReturn:
        # The text so far is kept; tool calls of a broken turn never run.
        llm.error, decision = decisions.broken(turn)
        self.emit(
            "step.end", step=llm.index, attempt=self.claim.attempt, finish_reason=llm.output["finish_reason"]
        )
        history = [*messages, turn.assistant_message(with_tool_calls=False)]
        self.conclude([llm], history, turn.usage, inputs, decision)
        raise AssertionError("a broken turn settles the run")

    def conclude(
        self,
        steps: list[StepRecord],
        messages: list[Message],
        usage: Usage,
        inputs: Sequence[str],
        decision: Settle,
        output: Any = None,
        *,
        unless_input: bool = False,
    ) -> None:
        """Save the step that ends the run and settle it, in one transaction. Returns only when
        ``unless_input`` and input arrived meanwhile: the step is saved, and the run goes on."""
        code, message = decision.error or ("", "")
        settled = self.db.save_and_settle(
            self.claim,
            steps,
            messages,
            finish_reason=_finish_reason(steps),
            usage=usage,
            consumed_inputs=inputs,
            status=decision.status,
            output=output,
            error_code=code,
            error_message=message,
            unless_input=unless_input,
            stored=self.stored(),
        )
        if settled is None:
            raise LeaseLostError(f"run {self.claim.run_id}: claim lost before saving steps")
        self.saved(messages)
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
        if settled:
            self.announce(decision.status)


def _finish_reason(steps: list[StepRecord]) -> str:
    """The checkpoint's finish reason: its model call's, when the steps start with one."""
    llm = (steps[0].output or {}) if steps[0].kind == "llm" else {}
    return str(llm.get("finish_reason") or "")


__all__ = ["Execution", "Settled", "execute", "worker_identity"]
