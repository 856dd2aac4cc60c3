"""Fakes for your own tests: an in-process scripted model, so agents run without any endpoint.

CHAMVI_RUNS = {"MODEL": "myapp.tests.MyScriptedModel"}   # a ScriptedModel subclass
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .core.types import (
    Aborted,
    AbortSignal,
    DeltaKind,
    Message,
    ModelRequest,
    ModelTurn,
    OnDelta,
    ToolCall,
    Usage,
)


@dataclass
class ScriptedTurn:
    text: str = ""
    reasoning: str = ""
    tool_calls: Sequence[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(tool name, arguments) pairs."""


class ScriptedModel:
    """Answers each request with the turn ``script(messages)`` returns, streamed word by word."""

    def __init__(self, script: Callable[[list[Message]], ScriptedTurn], chunk_delay: float = 0.0) -> None:
        self.script = script
        self.chunk_delay = chunk_delay

    def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        scripted = self.script(request.messages)
        parts: list[tuple[DeltaKind, str]] = [("reasoning", scripted.reasoning), ("text", scripted.text)]
        for kind, text in parts:
            words = text.split(" ")
            for n, word in enumerate(words):
                if abort.wait(self.chunk_delay) if self.chunk_delay else abort.is_set():
                    raise Aborted(abort.reason)
                on_delta(kind, word if n == len(words) - 1 else word + " ")
        calls = [
            ToolCall(id=f"call_{secrets.token_hex(6)}", name=name, arguments=json.dumps(args))
            for name, args in scripted.tool_calls
        ]
        prompt = sum(len(json.dumps(m)) for m in request.messages) // 4
        return ModelTurn(
            text=scripted.text,
            reasoning=scripted.reasoning,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            usage=Usage(prompt, max(1, len(scripted.text) // 4)),
        )
