"""Exceptions of chamvi_runs."""

from __future__ import annotations


class ChamviError(Exception):
    """Base class of every chamvi_runs error."""


class AgentNotFound(ChamviError, LookupError):
    pass


class RunNotFound(ChamviError, LookupError):
    pass


class InvalidPayload(ChamviError, ValueError):
    """A trigger payload or steering input that cannot be stored (not JSON, too large)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class ThreadForbidden(ChamviError, PermissionError):
    """The thread belongs to someone whose history the caller may not view (HTTP 403)."""


class LeaseLostError(ChamviError):
    """The execution no longer holds the run's claim: it stops and writes nothing more."""


class ToolArgumentsError(ChamviError, ValueError):
    """The model's arguments for a tool failed validation; the model sees the message."""


class ArtifactNotFound(ChamviError):
    pass


class InputRefused(ChamviError):
    """A steering input over its run's caps, stored nowhere. ``code``: ``too_many_inputs`` (the run
    took ``MAX_INPUTS`` already; final) or ``inputs_pending`` (``MAX_PENDING_INPUT_BYTES`` of input
    wait for the run's next model call; send it once that call has taken them)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class DecisionRefused(ChamviError):
    """An approval was already decided, expired, or is unknown."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class InvalidAnswer(ChamviError, ValueError):
    """An answer or edited arguments that do not fit their schema, or an edit of a tool whose
    approval is not editable; nothing was recorded. ``code``: ``invalid_answer``,
    ``invalid_arguments`` or ``not_editable`` (HTTP 400); the message names the field."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class HistoryUnavailable(ChamviError, LookupError):
    """The history after that step cannot be rebuilt: the run has no such step, or it was stored
    whole (before histories were stored step by step) and only its latest state is known."""
