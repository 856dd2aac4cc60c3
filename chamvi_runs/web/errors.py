"""The web layer's one error: an HTTP status, a stable code and a message. The JSON API answers it as
``{"error": {"code", "message"}}`` with the status; the pages, the websocket and the admin show the
code and the message their own way."""

from __future__ import annotations

from ..errors import (
    ChamviError,
    DecisionRefused,
    HistoryUnavailable,
    InputRefused,
    InvalidAnswer,
    InvalidPayload,
    RunNotFound,
    ThreadForbidden,
)

# A refusal whose code is not here (``run_settled``) is a 409.
REFUSAL_STATUS = {"not_found": 404, "bad_token": 403, "already_decided": 409, "expired": 410}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    @classmethod
    def of(cls, exc: ChamviError) -> ApiError:
        """What the web layer answers for an error of the Python API."""
        if isinstance(exc, DecisionRefused):
            return cls(REFUSAL_STATUS.get(exc.code, 409), exc.code, str(exc))
        if isinstance(exc, InvalidAnswer):
            return cls(400, exc.code, str(exc))
        if isinstance(exc, InvalidPayload):
            if exc.too_large:
                return cls(413, "payload_too_large", str(exc))
            return cls(400, "invalid_payload", str(exc))
        if isinstance(exc, InputRefused):
            # Too many requests: the run's caps of steering input (``too_many_inputs`` is final,
            # ``inputs_pending`` lasts until the run's next model call takes what waits).
            return cls(429, exc.code, str(exc))
        if isinstance(exc, RunNotFound):
            return cls(404, "not_found", str(exc))
        if isinstance(exc, HistoryUnavailable):
            return cls(409, "history_unavailable", str(exc))
        if isinstance(exc, ThreadForbidden):
            return cls(403, "thread_forbidden", str(exc))
        return cls(409, "refused", str(exc))


def unauthenticated() -> ApiError:
    return ApiError(401, "unauthenticated", "log in or send 'Authorization: Bearer <token>'")
