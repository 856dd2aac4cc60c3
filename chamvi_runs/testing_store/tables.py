"""The in-memory database: its tables, its clock, its transactions, the fence of a claim, and the
writes that both an execution's settle and a cancel make inside their transaction."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from ..core.messages import answer_open_calls
from ..core.records import Claim
from ..core.states import Status
from ..models import Run, RunInput, Step, WaitPoint
from . import histories
from .histories import CheckpointRow


@dataclass
class Tables:
    """The rows, as the database holds them: unsaved model instances (a checkpoint as the fields its
    history is read from). Reads hand out copies, as a query returns new instances."""

    runs: dict[str, Run] = field(default_factory=dict)
    steps: dict[str, dict[int, Step]] = field(default_factory=dict)
    """Run id -> step index -> step."""
    checkpoints: dict[str, CheckpointRow] = field(default_factory=dict)
    waitpoints: dict[str, WaitPoint] = field(default_factory=dict)
    """By approval id, in creation order."""
    inputs: dict[str, RunInput] = field(default_factory=dict)


class Database:
    """Tables, a clock a test moves, and transactions. Thread-safe: the lease keeper reads and
    renews from its own thread while an execution writes from another, as against PostgreSQL."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self._now = now or timezone.now()
        self._lock = threading.RLock()
        self._tables = Tables()
        self._ids = itertools.count(1)

    @property
    def now(self) -> datetime:
        """The database's clock: leases and wait points expire by it, never by the host's time."""
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock on by ``seconds`` (a lease that runs out lets another worker claim)."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def _stamp(self) -> datetime:
        """The time of an insert. Rows are ordered by creation time, ties broken by a random id:
        two inserts one after the other get distinct times, as they do from the database."""
        self._now += timedelta(microseconds=1)
        return self._now

    def _next_id(self) -> int:
        return next(self._ids)

    @contextmanager
    def _atomic(self) -> Iterator[Tables]:
        """A transaction: every write in it applies, or (it raised) none does. One at a time, as
        if each locked every row it touches."""
        with self._lock:
            saved = copy.deepcopy(self._tables)
            try:
                yield self._tables
            except BaseException:
                self._tables = saved
                raise

    def _row(self, run_id: str) -> Run:
        run = self._tables.runs.get(run_id)
        if run is None:
            raise Run.DoesNotExist(f"Run matching query does not exist: {run_id}")
        return run

    def _free(self, run: Run) -> bool:
        """No claim, or an expired one: ``claim_expires_at__lt=Now()``, strictly before now."""
        expires = run.claim_expires_at
        return run.claim_owner is None or (expires is not None and expires < self._now)

    def _held(self, claim: Claim, *, unless_cancelled: bool = False) -> Run | None:
        """The row ``fence.update_held`` updates: running, same owner, same attempt (and, with
        ``unless_cancelled``, no cancel requested). The lease's expiry is no part of it: a claim
        whose lease ran out still writes until another claim takes the run, as on PostgreSQL."""
        run = self._tables.runs.get(claim.run_id)
        if (
            run is None
            or run.status != Status.RUNNING
            or run.claim_owner != claim.owner
            or run.attempt != claim.attempt
        ):
            return None
        if unless_cancelled and run.cancel_requested:
            return None
        return run

    def _cancel_open_approval(self, run_id: str, by: Any = None) -> None:
        """``progress.cancel_open_approval``: inside the cancel's transaction, the run's open wait
        points are decided ``cancelled``."""
        for waitpoint in self._tables.waitpoints.values():
            if waitpoint.run_id == run_id and waitpoint.decision is None:
                waitpoint.decision = WaitPoint.Decision.CANCELLED.value
                waitpoint.decided_by = by if getattr(by, "pk", None) else None
                waitpoint.decided_at = self._now
                waitpoint.reason = "run cancelled"

    def _close_history_of(self, run_id: str, reason: str | None) -> None:
        """``progress.close_history_of``: every open tool call gets ``reason`` (None: they stay
        open), and the whole history is written."""
        checkpoint = self._tables.checkpoints.get(run_id)
        steps = self._tables.steps.get(run_id, {})
        if reason is None:
            histories.append(run_id, checkpoint, steps, lambda _history: [])
        else:
            histories.append(
                run_id, checkpoint, steps, lambda history: answer_open_calls(history, reason)[len(history) :]
            )


def check_constraints(existing: Iterable[WaitPoint], new: WaitPoint) -> None:
    """The unique constraints of ``models.WaitPoint`` an insert could break, as the IntegrityError
    the database raises (the transaction rolls back): one open approval per run
    (``chamvi_waitpoint_one_open_approval``), one wait point per call (``chamvi_waitpoint_one_per_call``)."""
    for other in existing:
        if other.run_id != new.run_id:
            continue
        if (other.model_step, other.call_position) == (new.model_step, new.call_position):
            raise IntegrityError(
                f"run {new.run_id}: call {new.model_step}/{new.call_position} has a wait point"
            )
        both_open = other.decision is None and new.decision is None
        if both_open and other.kind == new.kind == WaitPoint.Kind.APPROVAL:
            raise IntegrityError(f"run {new.run_id} has an open approval already")
