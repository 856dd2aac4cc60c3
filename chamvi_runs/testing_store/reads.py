"""The reads of an execution (``store.queries``), and the lists a test looks at what was written
through. Each returns copies: changing one changes nothing stored, as with rows a query returns."""

from __future__ import annotations

import copy
from collections.abc import Collection

from ..core.branches import Node
from ..core.records import Decided
from ..core.types import Message
from ..errors import HistoryUnavailable
from ..models import Run, RunInput, Step, WaitPoint
from . import histories
from .tables import Database


class Reads(Database):
    def run(self, run_id: str) -> Run:
        """Raises ``Run.DoesNotExist``, as ``Run.objects.get`` does."""
        with self._lock:
            return copy.deepcopy(self._row(run_id))

    def ancestors(self, run: Run) -> tuple[list[str], str | None, str]:
        """``children.ancestors``: the runs above ``run``, nearest first, and the topmost's thread
        and scope."""
        with self._lock:
            above: list[str] = []
            thread, scope, parent_id = run.thread, run.scope, run.parent_id
            while parent_id is not None and parent_id not in above and parent_id in self._tables.runs:
                parent = self._tables.runs[parent_id]
                above.append(parent_id)
                thread, scope, parent_id = parent.thread, parent.scope, parent.parent_id
            return above, thread, scope

    def checkpoint(self, run_id: str) -> tuple[list[Message], int] | None:
        return self.history(run_id)

    def thread_nodes(self, thread: str, scope: str) -> list[Node]:
        """The runs of a thread in creation order (ties broken by id), as ``core.branches`` sees them."""
        with self._lock:
            runs = sorted(
                (r for r in self._tables.runs.values() if r.thread == thread and r.scope == scope),
                key=lambda r: (r.created_at, r.pk),
            )
            return [
                Node(r.pk, r.replaces_id, r.base_id if r.replaces_id is None else None, r.base_step == -1)
                for r in runs
            ]

    def history(self, run_id: str, index: int | None = None) -> tuple[list[Message], int] | None:
        """``histories.history``: None without a checkpoint; HistoryUnavailable for a step the run
        does not have."""
        with self._lock:
            checkpoint = self._tables.checkpoints.get(run_id)
            if checkpoint is None:
                return None
            at = checkpoint.step_index if index is None else index
            steps = self._tables.steps.get(run_id, {})
            try:
                return histories.history_at(run_id, checkpoint, steps, at), at
            except ValueError as exc:
                raise HistoryUnavailable(str(exc)) from None

    def pending_inputs(self, run_id: str) -> list[RunInput]:
        """The steering inputs no model call has taken yet, oldest first."""
        return [item for item in self.inputs(run_id) if item.consumed_step is None]

    def last_model_step(self, run_id: str, before: int | None = None) -> Step | None:
        llm = [
            s for s in self.steps(run_id) if s.kind == Step.Kind.LLM and (before is None or s.index < before)
        ]
        return llm[-1] if llm else None

    def waiting_at(self, run_id: str, model_step: int, position: int) -> bool:
        return any(
            w.model_step == model_step and w.call_position >= position and w.decision is None
            for w in self.waitpoints(run_id)
        )

    def decided_calls(self, run_id: str, model_step: int) -> dict[int, Decided]:
        """Approved calls, questions answered or expired, child runs settled (a denied or expired
        approval is answered in the history already)."""
        return {
            w.call_position: Decided(
                w.kind, w.decision or "", w.arguments_hash, w.approved_input, w.answer, w.reason
            )
            for w in self.waitpoints(run_id)
            if w.model_step == model_step
            and (
                w.decision == WaitPoint.Decision.APPROVED
                or (
                    w.kind == WaitPoint.Kind.INPUT
                    and w.decision in (WaitPoint.Decision.ANSWERED, WaitPoint.Decision.EXPIRED)
                )
                or (
                    w.kind == WaitPoint.Kind.CHILD
                    and w.decision in (WaitPoint.Decision.ANSWERED, WaitPoint.Decision.FAILED)
                )
            )
        }

    def resumed_decision(self, run_id: str) -> WaitPoint | None:
        """Decided, not by a cancel, with no step saved after its wait step; the latest one."""
        with self._lock:
            last = max(self._tables.steps.get(run_id, {}), default=-1)
            decided = [
                w
                for w in self.waitpoints(run_id)
                if w.decision is not None
                and w.decision != WaitPoint.Decision.CANCELLED
                and last <= w.step_index
            ]
            return max(decided, key=lambda w: (w.created_at, w.pk), default=None)

    def hand_back(self) -> None:
        """Nothing to give back: no connection is held."""

    def cancels_among(self, run_ids: Collection[str]) -> set[str]:
        with self._lock:
            runs = self._tables.runs
            return {run_id for run_id in run_ids if run_id in runs and runs[run_id].cancel_requested}

    # --- what a test looks at ----------------------------------------------------------------

    def steps(self, run_id: str) -> list[Step]:
        """The run's steps in index order."""
        with self._lock:
            recorded = self._tables.steps.get(run_id, {})
            return [copy.deepcopy(recorded[index]) for index in sorted(recorded)]

    def waitpoints(self, run_id: str) -> list[WaitPoint]:
        """The run's wait points, oldest first."""
        with self._lock:
            return [copy.deepcopy(w) for w in self._tables.waitpoints.values() if w.run_id == run_id]

    def inputs(self, run_id: str) -> list[RunInput]:
        """The run's steering inputs, oldest first."""
        with self._lock:
            rows = sorted(
                (i for i in self._tables.inputs.values() if i.run_id == run_id),
                key=lambda i: (i.created_at, i.pk),
            )
            return [copy.deepcopy(i) for i in rows]
