"""Value types of the tool loop: messages, usage, tool calls, a model request and its turn, the
abort signal. The protocols the runtime talks to are in ``ports``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, Any]
"""One Chat Completions message, stored as is in checkpoints."""

RESPONSE_ITEMS = "response_items"
"""The key of an assistant message that keeps what a Responses API turn with reasoning sent: its
reasoning items, sent back with the turn (in the same order, the API pairs each with the item after
it by id), its messages and its calls' item ids. Opaque to the engine; left out of Chat Completions
requests."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


NO_USAGE = Usage()


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The raw JSON text the model sent; it may be invalid."""

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    response_format: dict[str, Any] | None = None


@dataclass
class ModelTurn:
    """What one streamed model call produced, complete or not."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    """None when the stream ended without one (a cut connection)."""
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    """Set when the model reported an error or the call raised."""
    response_items: list[dict[str, Any]] = field(default_factory=list)
    """A Responses API turn with reasoning: its output items in order (``RESPONSE_ITEMS``)."""

    def assistant_message(self, *, with_tool_calls: bool = True) -> Message:
        """The turn as the history keeps it. Without its tool calls (a broken turn) it keeps no
        reasoning items either: the API refuses a reasoning item without the items that followed it."""
        message: Message = {"role": "assistant", "content": self.text or None}
        if with_tool_calls and self.tool_calls:
            message["tool_calls"] = [call.as_message_part() for call in self.tool_calls]
        if with_tool_calls and self.response_items:
            message[RESPONSE_ITEMS] = self.response_items
        return message


DeltaKind = Literal["text", "reasoning"]
OnDelta = Callable[[DeltaKind, str], None]


class Aborted(Exception):
    """The model call was aborted because the run was cancelled, drained or lost its lease."""


class AbortSignal:
    """Set from another thread (heartbeat, cancel poll, drain) to stop the execution."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def set(self, reason: str) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the signal is set (at once if it already is); returns an unsubscriber."""
        with self._lock:
            already = self._event.is_set()
            if not already:
                self._callbacks.append(callback)
        if already:
            callback()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe
