"""What one execution writes, each write fenced on its claim (``store``): a model call counted, a
lease renewed with its usage, a step saved, a wait opened, the run settled.

A write that keeps the execution going returns None; one that ends it returns its ending
(``core.endings``): ``Settled`` once the settle is announced, ``Waiting`` once the wait is, and
``Abandoned`` when the store refused the write, the claim being lost. The engine decides what to
write (``core.decisions``); this carries it out and says how it went.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import signals
from ..agents.agent import Agent
from ..conf import conf
from ..core import decisions
from ..core.decisions import ABANDON, Marker, Settle
from ..core.endings import Abandoned, Ending, Settled, Waiting, lost
from ..core.faults import crash_point
from ..core.ports import Broadcaster, Store
from ..core.records import Claim, Opening, StepRecord, Stored
from ..core.states import TERMINAL, Status
from ..core.types import NO_USAGE, AbortSignal, Message, Usage
from ..dispatch.doorbell import enqueue
from ..models import Run
from ..streaming import events
from ..streaming.serializers import waiting_event
from .lease_keeper import Lease
from .lifecycle import announce_settled
from .notifications import notify
from .tool_calls import Answered


class FencedWrites:
    """One execution's writes. It is the run's only writer while it holds the claim, so what of the
    history is stored is known here (``store.histories``): how many messages, whether this
    execution saved yet (its first save writes the whole history), and until the run's first save,
    the history it opens with."""

    def __init__(
        self, claim: Claim, db: Store, broadcaster: Broadcaster, emit: Callable[[events.Event], None]
    ) -> None:
        self.claim = claim
        self.db = db
        self.broadcaster = broadcaster
        self.emit = emit
        self.lease: Lease | None = None
        self.stored_length = 0
        self.saved_once = False
        self.opening: Opening | None = None
        self.counted: list[Any] | None = None
        """The inputs of the next model call when the last save counted it (``save_and_count``);
        None when that call is not counted yet."""

    def opens(self, messages: list[Message], opening: Opening | None) -> None:
        """Where the execution starts (``start_point``): the history it loads is stored, or before
        the run's first save, the opening's part of it."""
        self.opening = opening
        self.stored_length = len(opening.messages) if opening is not None else len(messages)

    def carry_out(self, decision: Settle | Marker | None, output: Any = None) -> Ending | None:
        """Carry out a decision of ``core.decisions``: None goes on; anything else ends the execution."""
        if decision is None:
            return None
        if decision is ABANDON:
            return lost(self.claim, "lease lost")
        assert isinstance(decision, Settle)
        return self.settle(decision, output)

    def stop_if_aborted(self, abort: AbortSignal) -> Ending | None:
        """What the execution's abort signal asks for (``core.decisions.on_abort``), carried out."""
        return self.carry_out(decisions.on_abort(abort.reason if abort.is_set() else None))

    def start_model_call(self) -> list[Any] | Ending:
        """Counted before it is made: a call whose execution dies unsaved still uses the budget.
        Returns the steering inputs the call takes."""
        counted, self.counted = self.counted, None
        if counted is not None:
            return counted
        inputs = self.db.start_model_call(self.claim)
        return lost(self.claim, "claim lost before a model call") if inputs is None else inputs

    def record_listings(self, listed: dict[str, Any], recorded: dict[str, Any] | None) -> Ending | None:
        """The toolset listings this execution made, recorded before any of their tools runs: a
        later execution of the run must have the tools this one offered the model."""
        if not self.db.record_listings(self.claim, listed, recorded):
            return lost(self.claim, "lease lost before recording the tools")
        return None

    def renew(self, usage: Usage) -> Ending | None:
        """Before a model call's tools run. The lease keeper checks only every heartbeat: a worker
        that froze during the stream learns here, before any tool runs, that another worker may
        hold the run now. The call's usage is recorded with it: a tool that kills the worker must
        not make the repeated call free."""
        if not self.db.renew(self.claim, conf.LEASE_SECONDS, usage=usage):
            return lost(self.claim, "lease lost before running tools")
        return None

    def settle(self, decision: Settle, output: Any = None) -> Settled | Abandoned:
        code, message = decision.error or ("", "")
        crash_point("before_settle")
        status = decision.status
        # A call the last save counted is not made now: the settle takes it back.
        uncount = self.counted is not None
        settled = self.db.settle(
            self.claim,
            status,
            output=output,
            error_code=code,
            error_message=message,
            close_history=decision.close,
            uncount_call=uncount,
        )
        if not settled and status not in TERMINAL:
            # Refused: a requested cancel wins over ``interrupted`` (or the claim is lost, and the
            # cancel is refused too).
            instead = decisions.on_refused_wait()
            status = instead.status
            settled = self.db.settle(self.claim, status, close_history=instead.close, uncount_call=uncount)
        if not settled:
            return lost(self.claim, "claim lost before settling")
        self.counted = None
        return self.announce(status)

    def announce(self, status: Status, run: Run | None = None) -> Settled:
        """After the settle's commit: its announcement, and the end of the execution. ``run``: the
        run as the settle left it, when the settle returned it."""
        if self.lease is not None:
            self.lease.stop()  # nothing is left to renew or cancel
        # A run settled by its first execution never waited: its run.end has no decisions to read.
        announce_settled(self.claim.run_id, self.broadcaster, waited=self.claim.resumed, run=run)
        return Settled(status)

    def back_to_waiting(self) -> Ending:
        """A resumed execution found its wait point still undecided."""
        if not self.db.back_to_waiting(self.claim):
            return self.settle(decisions.on_refused_wait())
        return Waiting()

    def save(
        self,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        usage: Usage = NO_USAGE,
        inputs: Sequence[str] = (),
    ) -> Ending | None:
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
            return lost(self.claim, "claim lost before saving steps")
        self.saved(messages)
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
        return None

    def save_and_count(
        self, steps: list[StepRecord], messages: list[Message], *, inputs: Sequence[str]
    ) -> Ending | None:
        """``save`` of a model call's tools, when the execution makes its next call right after:
        that call is counted in the same transaction, one write and one commit fewer per call. The
        inputs waiting for it are kept for it (``start_model_call``)."""
        waiting = self.db.save_step_and_count(
            self.claim,
            steps,
            messages,
            finish_reason=_finish_reason(steps),
            consumed_inputs=inputs,
            stored=self.stored(),
        )
        if waiting is None:
            return lost(self.claim, "claim lost before saving steps")
        self.counted = waiting
        self.saved(messages)
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
        return None

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

    def open_wait(self, agent: Agent, answered: Answered, *, usage: Usage, inputs: Sequence[str]) -> Ending:
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
                ending = self.save(steps, messages, usage=usage, inputs=inputs)
                if ending is not None:
                    return ending
            return self.settle(decisions.on_refused_wait())
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=[*steps, *waits])
        for waitpoint in waitpoints:
            # A child run's wait asks nobody: viewers follow the child (the run's ``children``).
            if waitpoint.child_id is None:
                self.emit(events.run_waiting(**waiting_event(waitpoint)))
        run = self.db.run(self.claim.run_id)
        for waitpoint in waitpoints:
            if waitpoint.child_id is not None:
                # Nobody is asked (no run_waiting, no notifier): the child run decides this wait.
                enqueue(waitpoint.child_id)
                continue
            signals.run_waiting.send(Run, run=run, waitpoint=waitpoint)
            notify(agent, run, waitpoint)
        return Waiting()

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
    ) -> Ending | None:
        """Save the step that ends the run and settle it, in one transaction. None only when
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
            return lost(self.claim, "claim lost before saving steps")
        self.saved(messages)
        signals.step_saved.send(Run, run_id=self.claim.run_id, steps=steps)
        if settled is False:
            return None
        return self.announce(decision.status, settled if isinstance(settled, Run) else None)


def _finish_reason(steps: list[StepRecord]) -> str:
    """The checkpoint's finish reason: its model call's, when the steps start with one."""
    llm = (steps[0].output or {}) if steps[0].kind == "llm" else {}
    return str(llm.get("finish_reason") or "")
