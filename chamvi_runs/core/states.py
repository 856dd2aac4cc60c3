"""Run statuses and the only transitions between them (SPEC §4).

The table is data so that the store, the admin and the docs read one source.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    QUEUED = "queued"
    """Created, not yet started by any worker."""
    RUNNING = "running"
    """Started: held by a worker, or free to be claimed after a decision or recovery."""
    WAITING = "waiting"
    """An approval is open; no worker holds the run."""
    INTERRUPTED = "interrupted"
    """Drained on worker shutdown; another worker resumes it from its checkpoint."""
    COMPLETED = "completed"
    """Terminal: the agent gave its final answer."""
    FAILED = "failed"
    """Terminal: see ``error_code``."""
    CANCELLED = "cancelled"
    """Terminal: cancelled by a user or by code."""


TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.RUNNING: frozenset(
        {Status.WAITING, Status.INTERRUPTED, Status.COMPLETED, Status.FAILED, Status.CANCELLED}
    ),
    Status.WAITING: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    Status.INTERRUPTED: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}

TERMINAL = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
ACTIVE = frozenset(Status) - TERMINAL


def sources_of(target: Status) -> frozenset[Status]:
    """Every status from which ``target`` may be reached."""
    return frozenset(s for s, targets in TRANSITIONS.items() if target in targets)


# Statuses a worker may claim. A waiting run is not among them: a decision makes it running. A
# running run is, once its lease is free (released after a decision, or expired after a crash);
# claiming it is no transition: its status stays, its claim changes hands.
CLAIMABLE = frozenset({Status.QUEUED, Status.RUNNING, Status.INTERRUPTED})


def can_transition(current: Status, target: Status) -> bool:
    return target in TRANSITIONS[current]


class ErrorCode(StrEnum):
    """Stable error codes of a failed run (SPEC §5)."""

    MODEL_ERROR = "model_error"
    INCOMPLETE_RESPONSE = "incomplete_response"
    ARTIFACT_NOT_FOUND = "artifact_not_found"
    BUDGET_EXCEEDED = "budget_exceeded"
    TIMEOUT = "timeout"
    AGENT_NOT_FOUND = "agent_not_found"
    APPROVAL_EXPIRED = "approval_expired"
    TOO_MANY_ATTEMPTS = "too_many_attempts"
    INVALID_OUTPUT = "invalid_output"
    TOOL_LOOP = "tool_loop"
    INTERNAL_ERROR = "internal_error"
    AGENT_VERSION_GONE = "agent_version_gone"
    """The run's agent version is gone from every worker, and its agent's ``on_version_change``
    rule failed it (SPEC §14)."""
    HISTORY_UNAVAILABLE = "history_unavailable"
    """A fork, regenerate or resend whose starting history was pruned before the run started."""
