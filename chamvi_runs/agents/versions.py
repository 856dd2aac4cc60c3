"""An agent's version (SPEC §14): what its runs were written for. Derived, it is a hash of what
changes how a run goes on: the instructions (when a string; a callable by its name), the model, the
output schema, and each tool's name, kind and argument schema (a tool factory by its name). Two
processes with the same agent code derive the same version; a deploy that changes any of these
changes it."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from .tools import Tool


def _named(value: Any) -> str:
    """A callable by the name it is found under: its body is not hashed. One without a name (a
    ``functools.partial``, an instance with ``__call__``) by what it wraps or its class: never by
    ``repr``, which may hold an address that differs from process to process."""
    while isinstance(value, functools.partial):
        value = value.func
    named = value if hasattr(value, "__qualname__") else type(value)
    return f"{getattr(named, '__module__', '')}.{named.__qualname__}"


def _tool(tool: Tool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "parameters": tool.schema()["function"]["parameters"],
        "effect": tool.effect,
        "question": tool.question is not None,
        "delegate": tool.delegate,
    }


def derived(agent: Any) -> str:
    """The hash of ``agent``'s (an ``Agent``: this module is below it) instructions, model, output
    schema and tools: 12 hex digits."""
    tools = agent.tools
    described = {
        "instructions": agent.instructions
        if isinstance(agent.instructions, str)
        else _named(agent.instructions),
        "model": agent.model,
        "output": agent.response_format(),
        "tools": _named(tools) if callable(tools) else [_tool(t) for t in tools],
    }
    text = json.dumps(described, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
