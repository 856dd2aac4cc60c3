"""The writes of an execution: ``store.claims`` (claim, renew, count a model call) and
``store.progress`` (steps, waits, settles). Each is fenced on the claim and says whether it applied,
with the Django store's rules (see ``chamvi_runs.store``); each method mirrors the function of its
name, and a comment names the source of a rule that is easy to get wrong."""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..core.messages import answer_open_calls
from ..core.records import Claim, StepRecord, Stored, WaitRequest, arguments_hash, hash_token, lacks_version
from ..core.states import CLAIMABLE, TERMINAL, Status, sources_of
from ..core.storable import storable
from ..core.types import NO_USAGE, Message, Usage
from ..models import Run, RunInput, Step, WaitPoint
from ..store.children import envelope
from ..store.histories import parts, stored_parts, writes_whole
from ..store.progress import CLOSED_AT_END
from . import histories
from .histories import as_stored
from .reads import Reads
from .tables import check_constraints


class Refused(Exception):
    """``progress._Refused``: rolls back a write whose fence, or step insert, refused it."""


class ExecutionWrites(Reads):
    # --- store.claims ------------------------------------------------------------------------

    def claim(
        self, run_id: str, owner: str, lease_seconds: float, versions: Mapping[str, str] | None = None
    ) -> Claim | None:
        """None: unknown, terminal, waiting, held by a live lease, blocked by its concurrency key
        or thread, or of a version the claimer does not have."""
        with self._atomic() as tables:
            run = tables.runs.get(run_id)
            if run is None or run.status not in CLAIMABLE or not self._free(run):
                return None
            if lacks_version(versions, run.agent, run.agent_version):
                return None
            if run.status == Status.QUEUED and self._blocked(run):
                return None
            claim = Claim(
                run_id,
                owner,
                run.attempt + 1,
                resumed=run.started_at is not None,
                stalled=run.stalled_executions,
                cancel_requested=run.cancel_requested,
            )
            # A running run keeps its status (no transition): its claim changes hands.
            run.status = Status.RUNNING.value
            run.claim_owner = owner
            run.claim_expires_at = self._now + timedelta(seconds=lease_seconds)
            run.attempt += 1
            # Counted now, reset by the execution's first write: one that dies before writing
            # anything stays counted (``claims.claim``).
            run.stalled_executions += 1
            run.started_at = run.started_at or self._now
            run.updated_at = self._now
            return claim

    def _blocked(self, run: Run) -> bool:
        """``claims._blocked``: another run of its concurrency key or thread (in its scope) is
        active, or queued and created first, ties broken by id (``fence.waits_for_elder``)."""
        if not run.concurrency_key and not run.thread:
            return False
        for name in ("concurrency_key", "thread"):
            value = getattr(run, name)
            if value is None:
                continue  # SQL's ``= NULL`` matches no row
            for other in self._tables.runs.values():
                if other.pk == run.pk or other.scope != run.scope or getattr(other, name) != value:
                    continue
                if other.status in (Status.RUNNING, Status.WAITING, Status.INTERRUPTED):
                    return True
                if other.status == Status.QUEUED and (other.created_at, other.pk) < (run.created_at, run.pk):
                    return True
        return False

    def renew(self, claim: Claim, lease_seconds: float, *, usage: Usage = NO_USAGE) -> bool:
        """False: the claim is lost. ``usage`` of a model call not saved yet counts at once."""
        with self._atomic():
            run = self._held(claim)
            if run is None:
                return False
            run.claim_expires_at = self._now + timedelta(seconds=lease_seconds)
            if usage.total:
                run.input_tokens += usage.input_tokens
                run.output_tokens += usage.output_tokens
            return True

    def renew_many(self, claims: Sequence[Claim], lease_seconds: float) -> set[str]:
        """The run ids still held, their leases extended."""
        with self._atomic():
            kept = set()
            for claim in claims:
                run = self._held(claim)
                if run is not None:
                    run.claim_expires_at = self._now + timedelta(seconds=lease_seconds)
                    kept.add(claim.run_id)
            return kept

    def start_model_call(self, claim: Claim) -> list[RunInput] | None:
        """Count the call before it is made; the inputs waiting for it. None: the claim is lost.
        (A requested cancel does not refuse it: the lease keeper's poll aborts the execution.)"""
        with self._atomic():
            run = self._held(claim)
            if run is None:
                return None
            run.model_calls += 1
            return self.pending_inputs(claim.run_id)

    # --- store.progress ----------------------------------------------------------------------

    def record_listings(self, claim: Claim, listed: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
        with self._atomic():
            run = self._held(claim)
            if run is None:
                return False
            run.listed_tools = {**(recorded or {}), **listed}
            return True

    def _record(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        finish_reason: str,
        usage: Usage,
        consumed_inputs: Iterable[str],
        *,
        stored: Stored | None = None,
        whole: bool = False,
        unless_cancelled: bool = False,
        **run_fields: Any,
    ) -> int:
        """``progress._record``, inside ``_atomic``: the fenced run update, the steps with their
        parts of the history, the checkpoint, the inputs the steps took. Raises Refused."""
        tables = self._tables
        run = self._held(claim, unless_cancelled=unless_cancelled)
        if run is None:
            raise Refused
        now = self._now
        run.input_tokens += usage.input_tokens
        run.output_tokens += usage.output_tokens
        run.stalled_executions = 0
        run.updated_at = now
        for name, value in run_fields.items():
            setattr(run, name, value)
        checkpoint = tables.checkpoints.get(claim.run_id)
        if stored is None:
            # The caller does not say what is stored: the whole history is written.
            stored = Stored((checkpoint.length if checkpoint is not None else None) or 0, whole=True)
        whole = writes_whole(messages, whole or stored.whole)
        added = stored_parts(parts(steps, messages[stored.length :]), whole)
        recorded = tables.steps.setdefault(claim.run_id, {})
        indexes = [s.index for s in steps]
        if len(set(indexes)) < len(indexes) or recorded.keys() & set(indexes):
            # ``chamvi_step_unique_index``: a step is recorded once; a duplicate means another
            # execution got there first, and the whole write is refused.
            raise Refused
        for s, part in zip(steps, added, strict=True):
            recorded[s.index] = Step(
                id=self._next_id(),
                run_id=claim.run_id,
                index=s.index,
                kind=s.kind,
                name=storable(s.name),
                input=as_stored(storable(s.input)),
                output=as_stored(storable(s.output)),
                error=storable(s.error),
                messages=as_stored(storable(part)),
                attempt=claim.attempt,
                started_at=s.started_at or now,
                finished_at=s.finished_at or now,
            )
        last = max(indexes)
        histories.move_checkpoint(
            tables.checkpoints,
            claim.run_id,
            last,
            messages,
            finish_reason,
            now=now,
            whole=whole,
            opening_length=stored.opening_length,
        )
        taken = set(consumed_inputs)
        for item in tables.inputs.values():
            if item.run_id == claim.run_id and item.consumed_step is None and item.pk in taken:
                item.consumed_step = min(indexes)
        return last

    def save_step(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str = "",
        usage: Usage = NO_USAGE,
        consumed_inputs: Iterable[str] = (),
        stored: Stored | None = None,
    ) -> bool:
        """False: the claim is lost (or another execution recorded these steps first); nothing
        was written."""
        try:
            with self._atomic():
                self._record(claim, steps, messages, finish_reason, usage, consumed_inputs, stored=stored)
        except Refused:
            return False
        return True

    def save_step_and_count(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str = "",
        usage: Usage = NO_USAGE,
        consumed_inputs: Iterable[str] = (),
        stored: Stored | None = None,
    ) -> list[RunInput] | None:
        """``save_step``, and the next model call counted in the same write; the inputs waiting
        for it. None: the claim is lost; nothing was written."""
        try:
            with self._atomic():
                self._record(claim, steps, messages, finish_reason, usage, consumed_inputs, stored=stored)
                run = self._held(claim)
                assert run is not None  # updated, fenced, by this transaction
                run.model_calls += 1
                return self.pending_inputs(claim.run_id)
        except Refused:
            return None

    def open_wait(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        waits: list[WaitRequest],
        usage: Usage = NO_USAGE,
        consumed_inputs: Iterable[str] = (),
        stored: Stored | None = None,
    ) -> list[WaitPoint] | None:
        """The steps that ask, a wait point per request, ``waiting`` and the claim released, at once.
        None: a cancel was requested (it wins over the wait) or the claim is lost; nothing written.
        The returned wait points carry their raw token (in memory only)."""
        tokens = [secrets.token_urlsafe(32) for _ in waits]
        try:
            with self._atomic() as tables:
                self._record(
                    claim,
                    steps,
                    messages,
                    "tool_calls",
                    usage,
                    consumed_inputs,
                    stored=stored,
                    whole=True,
                    unless_cancelled=True,
                    status=Status.WAITING.value,
                    claim_owner=None,
                    claim_expires_at=None,
                )
                children = self._start_children(claim, waits)
                created = []
                for wait, token in zip(waits, tokens, strict=True):
                    tool_input = as_stored(storable(wait.input))
                    waitpoint = WaitPoint(
                        id=self._next_id(),
                        run_id=claim.run_id,
                        kind=wait.kind,
                        step_index=wait.step_index,
                        model_step=wait.call.model_step,
                        call_position=wait.call.position,
                        arguments_hash=arguments_hash(tool_input),
                        tool_call_id=storable(wait.call.call_id),
                        tool_name=storable(wait.tool_name),
                        input=tool_input,
                        editable=wait.editable,
                        answer_schema=as_stored(wait.answer_schema),
                        client=wait.client,
                        child_id=children.get(wait.call.position),
                        expires_at=None if wait.kind == WaitPoint.Kind.CHILD else self._now + wait.ttl,
                        token_hash=hash_token(token),
                        created_at=self._stamp(),
                    )
                    check_constraints(tables.waitpoints.values(), waitpoint)
                    tables.waitpoints[waitpoint.approval_id] = waitpoint
                    created.append(waitpoint)
        except Refused:
            return None
        out = []
        for waitpoint, token in zip(created, tokens, strict=True):
            mine = copy.deepcopy(waitpoint)
            mine.token = token
            out.append(mine)
        return out

    def _start_children(self, claim: Claim, waits: list[WaitRequest]) -> dict[int, str]:
        """``children.start_children``, inside ``_atomic``: position -> id of the queued child run."""
        parent = self._tables.runs[claim.run_id]
        children = {}
        for wait in waits:
            if wait.kind != WaitPoint.Kind.CHILD or wait.delegate is None:
                continue
            now = self._stamp()
            child = Run(
                agent=wait.delegate,
                status=Status.QUEUED.value,
                trigger=as_stored(envelope(storable(wait.input))),
                scope=parent.scope,
                created_by_id=parent.created_by_id,
                parent_id=parent.pk,
                parent_step=wait.call.model_step,
                parent_position=wait.call.position,
                depth=parent.depth + 1,
                created_at=now,
                updated_at=now,
            )
            self._tables.runs[child.pk] = child
            children[wait.call.position] = child.pk
        return children

    def back_to_waiting(self, claim: Claim) -> bool:
        """False: a cancel was requested (it wins), or the claim is lost; nothing written."""
        with self._atomic():
            run = self._held(claim, unless_cancelled=True)
            if run is None:
                return False
            run.status = Status.WAITING.value
            run.claim_owner = run.claim_expires_at = None
            run.stalled_executions = 0
            run.updated_at = self._now
            return True

    def save_and_settle(
        self,
        claim: Claim,
        steps: list[StepRecord],
        messages: list[Message],
        *,
        finish_reason: str,
        usage: Usage,
        consumed_inputs: Iterable[str],
        status: Status,
        output: Any = None,
        error_code: str = "",
        error_message: str = "",
        unless_input: bool = False,
        stored: Stored | None = None,
    ) -> Run | bool | None:
        """The settled run: saved and settled. False: saved, not settled (``unless_input``, and
        input arrived meanwhile: the run goes on). None: the claim is lost, nothing written. A
        requested cancel does not refuse it: a terminal settle wins."""
        assert status in TERMINAL
        consumed = list(consumed_inputs)
        try:
            with self._atomic() as tables:
                closed = answer_open_calls(messages, CLOSED_AT_END)
                self._record(claim, steps, closed, finish_reason, usage, consumed, stored=stored, whole=True)
                if unless_input and any(
                    item.run_id == claim.run_id and item.consumed_step is None and item.pk not in consumed
                    for item in tables.inputs.values()
                ):
                    return False
                run = self._held(claim)
                assert run is not None  # updated, fenced, by this transaction
                self._settled(run, status, output, error_code, error_message)
        except Refused:
            return None
        return self.run(claim.run_id)

    def settle(
        self,
        claim: Claim,
        status: Status,
        *,
        output: Any = None,
        error_code: str = "",
        error_message: str = "",
        close_history: str | None = None,
        uncount_call: bool = False,
    ) -> bool:
        """A terminal status or ``interrupted``; releases the claim. A terminal settle answers every
        open tool call (``close_history``, or a generic text). ``uncount_call`` takes back a model
        call counted and not made. False, nothing written: the claim is lost, or (``interrupted``
        only) a cancel was requested, which wins."""
        if status in TERMINAL:
            close_history = close_history or CLOSED_AT_END
        with self._atomic():
            run = self._held(claim, unless_cancelled=status not in TERMINAL)
            # ``fence.to``: only from a status the transition table allows.
            if run is None or run.status not in sources_of(status):
                return False
            self._settled(run, status, output, error_code, error_message)
            if uncount_call:
                run.model_calls -= 1
            if status == Status.CANCELLED:
                self._cancel_open_approval(claim.run_id)
            # The run leaves its worker: its whole history is written, closed or not.
            self._close_history_of(claim.run_id, close_history)
            return True

    def _settled(self, run: Run, status: Status, output: Any, error_code: str, error_message: str) -> None:
        """``progress._settled_fields``."""
        run.status = status.value
        run.claim_owner = run.claim_expires_at = None
        run.stalled_executions = 0
        run.updated_at = self._now
        if status in TERMINAL:
            run.output = as_stored(storable(output))
            run.error_code = error_code
            run.error_message = storable(error_message)
            run.finished_at = self._now
