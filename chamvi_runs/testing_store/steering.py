"""Writes from outside an execution: starting a run (``api.start_run``, ``store.create_run``), and
``store.steering``'s cancel, steering input and decisions. Each refuses what the Django store
refuses, with the same errors and codes."""

from __future__ import annotations

import copy
import json
import secrets
from typing import Any

from ..conf import conf
from ..core.decisions import CLOSED_BY
from ..core.messages import tool_result
from ..core.records import arguments_hash, hash_token
from ..core.states import TERMINAL, Status, sources_of
from ..core.storable import storable
from ..errors import DecisionRefused, InputRefused, InvalidAnswer, RunNotFound
from ..models import Run, RunInput, WaitPoint
from . import histories
from .histories import as_stored
from .tables import Database

# What each decision may decide (``steering._DECIDES``).
_DECIDES = {
    WaitPoint.Decision.APPROVED: WaitPoint.Kind.APPROVAL,
    WaitPoint.Decision.DENIED: WaitPoint.Kind.APPROVAL,
    WaitPoint.Decision.ANSWERED: WaitPoint.Kind.INPUT,
}


class Steering(Database):
    def start_run(
        self,
        agent: str,
        payload: Any = None,
        *,
        source: str = "api",
        trigger: str = "api",
        keys: dict[str, Any] | None = None,
        thread: str | None = None,
        concurrency_key: str | None = None,
        scope: str = "",
        id: str | None = None,
    ) -> Run:
        """A queued run with the trigger envelope ``api.start_run`` builds; nothing is enqueued (an
        execution is started by the test). The same ``id`` for the same agent in the same scope
        returns the first run. The agent is not looked up: executing a run of an unknown agent
        fails it (``agent_not_found``), a path of its own."""
        envelope = {
            "id": id,
            "source": source,
            "trigger": trigger,
            "payload": payload,
            "keys": keys or {},
            "thread": thread,
            "receivedAt": self._now.isoformat(),
            "attachments": [],
        }
        with self._atomic() as tables:
            if id is not None:
                for run in tables.runs.values():
                    if (run.agent, run.scope, run.trigger_id) == (agent, scope, id):
                        return copy.deepcopy(run)
            now = self._stamp()
            run = Run(
                agent=agent,
                status=Status.QUEUED.value,
                trigger=as_stored(envelope),
                trigger_id=id,
                scope=scope,
                concurrency_key=concurrency_key,
                thread=thread,
                created_at=now,
                updated_at=now,
            )
            tables.runs[run.pk] = run
            return copy.deepcopy(run)

    def cancel(self, run_id: str, *, by: Any = None) -> bool:
        """``steering.cancel``. True: settled ``cancelled`` now (no worker held it). False: a worker
        holds it and now aborts it (``cancel_requested`` is set; its lease keeper polls it), or it
        had settled already. Raises RunNotFound."""
        with self._atomic() as tables:
            run = tables.runs.get(run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status in sources_of(Status.CANCELLED) and self._free(run):
                run.status = Status.CANCELLED.value
                run.cancel_requested = True
                run.claim_owner = run.claim_expires_at = None
                run.finished_at = run.updated_at = self._now
                self._cancel_open_approval(run_id, by)
                self._close_history_of(run_id, CLOSED_BY["cancel"])
                return True
            if run.status == Status.RUNNING:
                run.cancel_requested = True
                run.updated_at = self._now
            return False

    def add_input(
        self,
        run_id: str,
        payload: Any,
        *,
        size: int | None = None,
        max_inputs: int | None = None,
        max_pending_bytes: int | None = None,
    ) -> RunInput:
        """``steering.add_input``, with ``api.send_input``'s defaults: ``size`` is the payload's
        bytes as JSON, the caps are the settings' (``MAX_INPUTS``, ``MAX_PENDING_INPUT_BYTES``).
        Raises RunNotFound, DecisionRefused (``run_settled``) or InputRefused; nothing is stored then."""
        size = len(json.dumps(payload, allow_nan=False).encode()) if size is None else size
        max_inputs = conf.MAX_INPUTS if max_inputs is None else max_inputs
        max_pending_bytes = conf.MAX_PENDING_INPUT_BYTES if max_pending_bytes is None else max_pending_bytes
        with self._atomic() as tables:
            run = tables.runs.get(run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status in TERMINAL:
                raise DecisionRefused(
                    f"run {run_id} is {run.status}; it takes no more input", code="run_settled"
                )
            taken = [item for item in tables.inputs.values() if item.run_id == run_id]
            pending = sum(item.size or 0 for item in taken if item.consumed_step is None)
            if len(taken) >= max_inputs:
                raise InputRefused(
                    f"run {run_id} has taken {len(taken)} inputs, as many as MAX_INPUTS "
                    f"({max_inputs}) allows",
                    code="too_many_inputs",
                )
            if pending + size > max_pending_bytes:
                raise InputRefused(
                    f"run {run_id} holds {pending} bytes of input its next model call has not taken "
                    f"yet; {size} more would pass MAX_PENDING_INPUT_BYTES ({max_pending_bytes}): send it "
                    "once that call has taken them",
                    code="inputs_pending",
                )
            item = RunInput(run_id=run_id, payload=as_stored(payload), size=size, created_at=self._stamp())
            tables.inputs[item.pk] = item
            return copy.deepcopy(item)

    def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        by: Any = None,
        reason: str = "",
        token: str | None = None,
        answer: Any = None,
        approved_input: Any = None,
    ) -> WaitPoint:
        """``steering.decide``: record a decision once and return the decided wait point, whose
        ``resumes`` says the run is ``running`` again (unclaimed: the test executes it). A denied or
        expired approval is answered in the history at once. Raises DecisionRefused (``not_found``,
        ``already_decided``, ``expired``, ``bad_token``, ``wrong_kind``) or InvalidAnswer
        (``not_editable``); nothing is written then."""
        with self._atomic() as tables:
            waitpoint = tables.waitpoints.get(approval_id)
            if waitpoint is None:
                raise DecisionRefused(f"no approval {approval_id}", code="not_found")
            run_id = waitpoint.run_id
            run = tables.runs[run_id]
            if token is not None and not secrets.compare_digest(hash_token(token), waitpoint.token_hash):
                raise DecisionRefused("this token does not decide this approval", code="bad_token")
            _check_kind(waitpoint, decision, approved_input)
            if waitpoint.decision is not None:
                code = "expired" if waitpoint.decision == WaitPoint.Decision.EXPIRED else "already_decided"
                raise DecisionRefused(f"approval {approval_id} was already {waitpoint.decision}", code=code)
            # ``expires_at__lte=Now()``: at its expiry time, it has expired.
            expired_now = waitpoint.expires_at is not None and waitpoint.expires_at <= self._now
            if decision != WaitPoint.Decision.EXPIRED and expired_now:
                raise DecisionRefused(
                    f"approval {approval_id} expired at {waitpoint.expires_at}", code="expired"
                )
            if run.status != Status.WAITING:
                raise DecisionRefused(f"run {run_id} is not waiting", code="already_decided")
            if approved_input is not None:
                waitpoint.approved_input = as_stored(storable(approved_input))
                waitpoint.arguments_hash = arguments_hash(approved_input)
            if decision == WaitPoint.Decision.ANSWERED:
                waitpoint.answer = as_stored(storable(answer))
            waitpoint.decision = decision
            waitpoint.decided_by = by if getattr(by, "pk", None) else None
            waitpoint.decided_at = self._now
            waitpoint.reason = storable(reason)
            if waitpoint.kind == WaitPoint.Kind.APPROVAL and decision != WaitPoint.Decision.APPROVED:
                self._answer_refused_call(waitpoint, decision, reason)
            # Questions of one model call are answered in any order; the run resumes with the last.
            resumes = not any(w.run_id == run_id and w.decision is None for w in tables.waitpoints.values())
            if resumes and run.status in sources_of(Status.RUNNING):
                run.status = Status.RUNNING.value
                run.updated_at = self._now
            decided = copy.deepcopy(waitpoint)
        decided.resumes = resumes
        return decided

    def _answer_refused_call(self, waitpoint: WaitPoint, decision: str, reason: str) -> None:
        """``steering._answer_refused_call``: the model is told the call was not run, and why."""
        verdict = "denied" if decision == WaitPoint.Decision.DENIED else "expired without a decision"
        text = f"The call to {waitpoint.tool_name} was not run: approval {verdict}."
        if reason:
            text += f" Reason: {reason}"
        run_id = waitpoint.run_id
        histories.append(
            run_id,
            self._tables.checkpoints.get(run_id),
            self._tables.steps.get(run_id, {}),
            lambda _history: [tool_result(waitpoint.tool_call_id, text)],
        )


def _check_kind(waitpoint: WaitPoint, decision: str, approved_input: Any) -> None:
    """``steering._check_kind``: an approval is approved or denied, a question answered; only an
    editable approval takes other arguments."""
    kind = _DECIDES.get(WaitPoint.Decision(decision))
    if kind is not None and kind != waitpoint.kind:
        what = (
            "a question is answered" if waitpoint.kind == WaitPoint.Kind.INPUT else "an approval is decided"
        )
        raise DecisionRefused(
            f"{waitpoint.approval_id} is {'a question' if kind == WaitPoint.Kind.APPROVAL else 'an approval'}"
            f": {what}, not {decision}",
            code="wrong_kind",
        )
    if approved_input is not None and not waitpoint.editable:
        raise InvalidAnswer(
            f"the arguments of {waitpoint.tool_name} cannot be changed before approving", code="not_editable"
        )
