"""One execution of a run (SPEC §5): claim, load the start point, loop model -> tools -> save, settle.

The engine interprets the decisions of ``core.decisions`` and carries them out: it reads run state
through the store (``core.ports.Store``), writes it through ``fenced_writes.FencedWrites``, takes
each model call and its tools through ``model_step.ModelSteps`` (the tools: ``tool_calls``), and
announces what happened on signals and the broadcaster. Each step returns where the loop goes on,
or how the execution ended (``core.endings``), which ``Execution.run`` acts on in one place. No
database transaction or row lock is held during a model call or a tool call, except the transaction
that records an effect tool together with its Django writes (see ``effects``).
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

from .. import signals, store
from ..agents.agent import Agent, RunContext, registry
from ..conf import conf
from ..core import decisions, log_context
from ..core.decisions import FINISH, Settle
from ..core.endings import Abandoned, Ending, Settled, Waiting
from ..core.faults import crash_point
from ..core.messages import last_assistant, open_tool_calls
from ..core.ports import Broadcaster, Store
from ..core.records import Claim
from ..core.states import ErrorCode, Status
from ..core.types import NO_USAGE, AbortSignal, Message
from ..errors import AgentNotFound, HistoryUnavailable, LeaseLostError
from ..models import Run
from ..streaming import events
from ..streaming.broadcast import ChannelsBroadcaster
from ..streaming.serializers import decision_json, start_lineage
from .fenced_writes import FencedWrites
from .lease_keeper import keeper
from .lifecycle import route
from .model_step import ModelSteps, Position
from .start_point import start_point
from .tool_calls import ToolCalls

logger = logging.getLogger(__name__)

STORE: Store = store
"""The Django store, checked against the port by mypy."""


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def execute(run_id: str, *, shutdown: AbortSignal | None = None, owner: str | None = None) -> str | None:
    """Claim ``run_id`` and execute it until it settles, waits or is aborted. Returns the status the
    execution left, or None when the run could not be claimed (a duplicate job is harmless, and a
    run of a version this process does not have is left to a process that has it)."""
    close_old_connections()
    # Only a run of a version this process has (SPEC §14): during a deploy, old workers leave the
    # new version's runs to new workers, and the other way round.
    claim = STORE.claim(run_id, owner or worker_identity(), conf.LEASE_SECONDS, registry.versions())
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
        self.run_row: Run = claim.row if claim.row is not None else db.run(claim.run_id)
        self.broadcaster: Broadcaster = ChannelsBroadcaster(*route(self.run_row, db))
        self.writes = FencedWrites(claim, db, self.broadcaster, self.emit)
        self.steps = ModelSteps(claim, self.run_row, self.abort, db, self.writes, self.emit)

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> str | None:
        # Every record logged while this thread executes the run names it (``chamvi_runs.logs``).
        with log_context.bound(log_context.of(self.claim)):
            status = None
            try:
                status = self._run()
                return status
            finally:
                signals.execution_ended.send(
                    Run, run_id=self.claim.run_id, attempt=self.claim.attempt, status=status
                )

    def _run(self) -> str | None:
        unsubscribe = self.shutdown.on_set(lambda: self.abort.set("drain")) if self.shutdown else None
        try:
            ending = self.execution()
        except (OperationalError, InterfaceError) as exc:
            # The database went away: nothing can be written, and nothing is wrong with the run.
            # Its lease expires and chamvi_tick hands it to a worker that can reach the database.
            logger.warning("run %s: database unavailable (%s); left for recovery", self.claim.run_id, exc)
            signals.execution_error.send(Run, run_id=self.claim.run_id, error=exc)
            return None
        except Exception as exc:
            return self.crashed(exc)
        finally:
            if self.writes.lease is not None:
                self.writes.lease.stop()
            if unsubscribe:
                unsubscribe()
            self.broadcaster.flush()
        return self.ended(ending)

    def execution(self) -> Ending:
        try:
            ending = self.writes.carry_out(decisions.on_claim(self.claim, conf.MAX_ATTEMPTS))
            if ending is not None:
                return ending
            try:
                agent = registry.get(self.run_row.agent)
            except AgentNotFound as exc:
                return self.writes.settle(Settle(Status.FAILED, (ErrorCode.AGENT_NOT_FOUND, str(exc))))
            deadline = agent.budget.deadline(time.monotonic())
            self.writes.lease = keeper.keep(self.claim, self.abort, deadline, self.db)
            decided = None
            if self.claim.resumed:
                decided = self.db.resumed_decision(self.claim.run_id)
                self.emit(events.run_resume(decision_json(decided) if decided is not None else None))
            else:
                self.emit(events.run_start(**start_lineage(self.run_row)))
            signals.run_started.send(
                Run,
                run=self.run_row,
                resumed=self.claim.resumed,
                attempt=self.claim.attempt,
                decision=decided,
            )
            return self.loop(agent)
        except LeaseLostError as exc:
            # Raised by a tool call (``tool_calls``, ``effects``): the claim was lost while tools ran.
            return Abandoned(str(exc))

    def ended(self, ending: Ending) -> str | None:
        """What the execution returns: the status it left, or None when its claim was lost (which
        it reports: another worker may hold the run, nothing is wrong with it)."""
        match ending:
            case Settled(status):
                return status
            case Waiting():
                return Status.WAITING
            case Abandoned(reason):
                error = LeaseLostError(reason)
                logger.warning("%s", error)  # the message names the run
                signals.execution_error.send(Run, run_id=self.claim.run_id, error=error)
                return None

    def crashed(self, exc: Exception) -> str | None:
        logger.exception("run %s: execution crashed", self.claim.run_id)
        signals.execution_error.send(Run, run_id=self.claim.run_id, error=exc)
        # Viewers get a stable code and a message without internals; the log has the traceback.
        message = f"an internal error stopped the run ({type(exc).__name__}); the worker log has details"
        try:
            ending = self.writes.settle(Settle(Status.FAILED, (ErrorCode.INTERNAL_ERROR, message)))
        except Exception:
            # The database is unreachable: the lease expires and chamvi_tick recovers the run.
            logger.exception("run %s: could not settle after a crash", self.claim.run_id)
            return None
        if isinstance(ending, Abandoned):
            error = LeaseLostError(ending.reason)
            logger.error("run %s: could not settle after a crash", self.claim.run_id, exc_info=error)
            return None
        return ending.status

    def emit(self, event: events.Event) -> None:
        self.broadcaster.publish(self.claim.run_id, event)

    def finish(self, agent: Agent, text: str) -> Ending:
        try:
            output = agent.parse_output(text)
        except ValueError as exc:
            return self.writes.settle(Settle(Status.FAILED, (ErrorCode.INVALID_OUTPUT, str(exc))))
        return self.writes.settle(Settle(Status.COMPLETED), output)

    # --- the loop ----------------------------------------------------------------------------

    def loop(self, agent: Agent) -> Ending:
        ctx = RunContext(run=self.run_row, agent=agent, abort=self.abort)
        try:
            messages, index, opening = start_point(self.db, self.run_row, resumed=self.claim.resumed)
        except HistoryUnavailable as exc:
            return self.writes.settle(Settle(Status.FAILED, (ErrorCode.HISTORY_UNAVAILABLE, str(exc))))
        self.writes.opens(messages, opening)
        listed: dict[str, Any] = {}
        tools = agent.assemble_tools(ctx, listed)
        if listed and (ending := self.writes.record_listings(listed, self.run_row.listed_tools)) is not None:
            return ending
        calls = ToolCalls(self.claim, self.abort, self.run_row, agent, tools, self.emit)
        if open_tool_calls(messages):
            resumed = self.resume_calls(agent, calls, messages, index)
            if isinstance(resumed, Ending):
                return resumed
            messages, index = resumed
        elif index > 0 and (ending := self.settle_saved_ending(agent, messages)) is not None:
            return ending
        while True:
            stepped = self.steps.take(agent, ctx, calls, messages, index)
            if isinstance(stepped, Ending):
                return stepped
            messages, index = stepped

    def settle_saved_ending(self, agent: Agent, messages: list[Message]) -> Ending | None:
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
            return self.finish(agent, messages[-1].get("content") or "")
        return self.writes.carry_out(decision)

    def resume_calls(
        self, agent: Agent, calls: ToolCalls, messages: list[Message], index: int
    ) -> Position | Ending:
        """The checkpoint ends on tool calls without results: an approval was asked for. Undecided:
        back to waiting, no model call. Decided: the approved call runs, then the calls after it."""
        last = self.db.last_model_step(self.claim.run_id, before=index)
        llm_index = last.index if last is not None else 0
        open_calls = open_tool_calls(messages)
        # Calls are answered in order: the open ones are the last of their model call's calls.
        first_position = len(last_assistant(messages).get("tool_calls") or []) - len(open_calls)
        if self.db.waiting_at(self.claim.run_id, llm_index, first_position):
            return self.writes.back_to_waiting()
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
            return self.writes.open_wait(agent, answered, usage=NO_USAGE, inputs=())
        if not answered.steps:
            return answered.messages, index
        ending = self.writes.save(answered.steps, answered.messages)
        return ending if ending is not None else (answered.messages, answered.steps[-1].index + 1)


__all__ = ["Execution", "execute", "worker_identity"]
