"""What an execution hands the store, and what a claim gives it back: plain values."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .storable import storable
from .types import ModelTurn


@dataclass(frozen=True)
class Claim:
    """One execution's hold on a run: every write of the execution is fenced on it."""

    run_id: str
    owner: str
    attempt: int
    """The fencing token: it grows with every claim of the run."""
    resumed: bool
    """True when an earlier execution had started the run (recovery, decision, drain)."""
    stalled: int = 0
    """Executions before this one, in a row, that ended without writing anything (they died)."""
    cancel_requested: bool = False
    row: Any = field(default=None, compare=False, repr=False)
    """The run as the claim left it, when the claim's write returned it (PostgreSQL): the
    execution needs no read of its own."""


def lacks_version(versions: Mapping[str, str] | None, agent: str, version: str) -> bool:
    """A claim's version rule (SPEC §14): a process with ``versions`` (agent -> version; None: any)
    does not execute a run of ``agent`` recorded at ``version`` unless it has that version. A run
    recorded before versions were (``version`` empty) is any process's."""
    return versions is not None and bool(version) and versions.get(agent) != version


@dataclass(frozen=True)
class CallRef:
    """One tool call by its place: the model call's step and the call's position in it. Never by
    the provider's call id, which providers reuse across turns."""

    model_step: int
    position: int
    call_id: str


@dataclass(frozen=True)
class Opening:
    """The history a run starts from, before its trigger message: its thread's latest, or the point
    it was forked from (a fork, a regenerate, a resend)."""

    messages: list[Any]


@dataclass(frozen=True)
class Stored:
    """What a save knows of the run's stored history, from the execution that holds the run:
    ``length`` messages are stored (the save stores the rest, each with the step that added it);
    ``whole`` has the whole history written too (the execution's first save); ``opening_length``:
    the run's first save, with how many messages came before its first step."""

    length: int
    whole: bool = False
    opening_length: int | None = None


@dataclass(frozen=True)
class WaitRequest:
    """A wait point an execution opens for one call: an approval, or a question (``kind`` input)."""

    call: CallRef
    tool_name: str
    input: Any
    kind: str
    ttl: timedelta
    step_index: int
    """The wait step that opens it."""
    started_at: datetime | None = None
    """When the call was reached: the wait step's start."""
    editable: bool = True
    answer_schema: dict[str, Any] | None = None
    client: bool = False
    delegate: str | None = None
    """A wait of kind ``child``: the agent of the child run the wait starts (``input`` is its
    trigger payload)."""
    delegate_version: str = ""
    """That agent's version, which the child run starts with."""


@dataclass(frozen=True)
class Decided:
    """A decided wait point as the execution resuming after it needs it: an approved call (with the
    arguments a person approved instead, if any), a question answered or expired, or a child run
    that settled."""

    kind: str
    decision: str
    arguments_hash: str
    approved_input: Any = None
    answer: Any = None
    reason: str = ""
    """A child run's wait decided ``failed``: why the child has no output."""


@dataclass
class StepRecord:
    """A step to be written. ``started_at``/``finished_at`` left None are the time of the write."""

    index: int
    kind: str
    name: str = ""
    input: Any = None
    output: Any = None
    error: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    invalid_call: bool = False
    """A tool step of a call that named no tool or had bad arguments (not stored: it feeds the
    invalid-call streak of this execution)."""


def arguments_hash(arguments: Any) -> str:
    """What an approval is bound to: the exact arguments of the call, canonically encoded, as they
    are stored and shown to the approver (a NUL or lone surrogate replaced): the call re-parsed from
    the history after the decision has it back, and is still the call that was approved."""
    encoded = json.dumps(
        storable(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(encoded.encode()).hexdigest()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def llm_step_output(turn: ModelTurn, finish: str | None) -> dict[str, Any]:
    """What an ``llm`` step stores of its model call."""
    return {
        "text": turn.text,
        "reasoning": turn.reasoning,
        "tool_calls": [c.as_message_part() for c in turn.tool_calls],
        "finish_reason": finish,
        "usage": {"input_tokens": turn.usage.input_tokens, "output_tokens": turn.usage.output_tokens},
    }
