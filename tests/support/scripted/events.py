"""What a scripted reply is made of: the events, their builders and ``Reply``."""

import json
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Text:
    content: str


@dataclass(frozen=True)
class Reasoning:
    content: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    index: int | None
    chunks: int


@dataclass(frozen=True)
class Finish:
    reason: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    type: str
    code: str | None


@dataclass(frozen=True)
class Cut:
    graceful: bool


@dataclass(frozen=True)
class Delay:
    seconds: float


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str
    type: str
    code: str | None
    headers: tuple[tuple[str, str], ...]
    param: str | None = None


@dataclass(frozen=True)
class Raw:
    payload: str


Event: TypeAlias = Text | Reasoning | ToolCall | Finish | Usage | ErrorEvent | Cut | Delay | HttpError | Raw


def text(content: str) -> Text:
    """A chunk whose ``choices[0].delta.content`` is ``content``."""
    return Text(content)


def reasoning(content: str) -> Reasoning:
    """A chunk whose ``choices[0].delta.reasoning_content`` is ``content`` (DeepSeek/vLLM style)."""
    return Reasoning(content)


def tool_call(id: str, name: str, arguments: str, index: int | None = None, chunks: int = 2) -> ToolCall:
    """Streaming tool-call deltas.

    The first delta carries ``index``, ``id``, ``type: "function"`` and
    ``function: {name, arguments: ""}``; ``arguments`` then follows split into ``chunks``
    deltas carrying only ``index`` and ``function.arguments``. ``chunks=0`` puts the whole
    ``arguments`` in the first delta instead. ``index`` defaults to the number of distinct
    tool-call ids earlier in the same Reply.
    """
    if chunks < 0:
        raise ValueError("chunks must be >= 0")
    return ToolCall(id, name, arguments, index, chunks)


def finish(reason: str) -> Finish:
    """A chunk with an empty delta and ``finish_reason = reason``."""
    return Finish(reason)


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    """A final ``choices: []`` chunk carrying ``usage`` (as sent with ``include_usage``)."""
    return Usage(prompt_tokens, completion_tokens)


def error_event(message: str, type: str = "server_error", code: str | None = None) -> ErrorEvent:
    """A mid-stream ``data: {"error": {...}}`` chunk, after which the stream ends. Must be last."""
    return ErrorEvent(message, type, code)


def cut(graceful: bool = False) -> Cut:
    """End the stream without a ``finish_reason`` and without ``data: [DONE]``. Must be last.

    ``graceful=False`` drops the connection mid-body (client: ``APIConnectionError``);
    ``graceful=True`` ends the HTTP body cleanly (client: iteration just stops).
    """
    return Cut(graceful)


def delay(seconds: float) -> Delay:
    """Sleep before sending the next event."""
    return Delay(seconds)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def http_error(
    status: int,
    message: str,
    type: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> HttpError:
    """An HTTP error response with body ``{"error": {"message", "type", "code"}}``.

    Every error carries ``retry-after: 0`` and ``retry-after-ms: 1``: the installed
    ``openai`` client ignores a zero ``retry-after`` and falls back to its exponential
    backoff (0.5 s, 1 s, ...), whereas ``retry-after-ms: 1`` makes its retries immediate.
    ``headers`` adds or overrides headers (e.g. ``{"x-should-retry": "false"}``); ``param`` names the
    request parameter at fault.
    May only be preceded by ``delay`` events and must be last.
    """
    if status < 400:
        raise ValueError("http_error status must be >= 400")
    error_type = type or _ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    if code is None and status == 429:
        code = "rate_limit_exceeded"
    merged = {"retry-after": "0", "retry-after-ms": "1"}
    merged.update({k.lower(): v for k, v in (headers or {}).items()})
    return HttpError(status, message, error_type, code, tuple(merged.items()), param)


def raw(payload: str | dict[str, Any]) -> Raw:
    """Send ``data: <payload>`` verbatim (a dict is JSON-encoded as is), for malformed-stream tests."""
    return Raw(payload if isinstance(payload, str) else json.dumps(payload))


class Reply:
    """One scripted response: a sequence of events, validated on construction."""

    def __init__(self, *events: Event) -> None:
        for position, event in enumerate(events):
            is_last = position == len(events) - 1
            if isinstance(event, ErrorEvent | Cut | HttpError) and not is_last:
                raise ValueError(f"{type(event).__name__} must be the last event of a Reply")
            if isinstance(event, HttpError) and not all(isinstance(e, Delay) for e in events[:position]):
                raise ValueError("http_error may only be preceded by delay events")
        self.events: tuple[Event, ...] = events

    def __repr__(self) -> str:
        return f"Reply{self.events!r}"

    @property
    def final_http_error(self) -> HttpError | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, HttpError) else None
