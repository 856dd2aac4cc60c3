"""An agent's version (SPEC §14): what its runs were written for. Derived, it is a hash of what
changes how a run goes on: the instructions (when a string; a callable by its name), the model, the
output schema, and each tool's name, kind and argument schema (a tool factory by its name; a
toolset by its configuration, since its tools are listed per run). Two
processes with the same agent code derive the same version; a deploy that changes any of these
changes it."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .tools import Tool
from .toolsets import Toolset

if TYPE_CHECKING:
    from ..models import Run

Move = Literal["continue", "fail"]
MOVES: tuple[Move, ...] = ("continue", "fail")


@dataclass(frozen=True)
class VersionChange:
    """What an agent's ``on_version_change`` rule is asked about: a run of version ``old``, which
    no worker has any more, that would go on under ``new`` (this process's version of the agent)."""

    run: Run
    old: str
    new: str
    called: frozenset[str]
    """The names of the tools the run's history called, or asked approval or an answer for."""


VersionRule = Move | Callable[[VersionChange], Move]


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
        "tools": _named(tools)
        if callable(tools)
        else [_tool(t) if isinstance(t, Tool) else t.describe() for t in tools],
    }
    # Only when not the default: agents of earlier releases keep the version they derived then.
    if agent.model_api != "chat":
        described["model_api"] = agent.model_api
    text = json.dumps(described, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def missing_tools(agent: Any, called: frozenset[str]) -> list[str]:
    """The tools of ``called`` that ``agent`` (an ``Agent``) no longer has; none for an agent whose
    tools a callable builds per run (they are known only then: a removed one is a tool error)."""
    if callable(agent.tools):
        return []
    toolsets = [t for t in agent.tools if isinstance(t, Toolset)]
    # A toolset's tools are known once listed: a name one of them may list is not called missing
    # (a tool its server dropped is a tool error); any other is.
    return sorted(
        name
        for name in called - {t.name for t in agent.tools if isinstance(t, Tool)}
        if not any(toolset.may_provide(name) for toolset in toolsets)
    )


def move(agent: Any, change: VersionChange) -> Move:
    """What ``agent``'s rule says of ``change``. The default goes on when every tool the run called
    is still there, and fails it otherwise: its history would hold calls the model cannot make."""
    rule = agent.on_version_change
    if rule is None:
        return "fail" if missing_tools(agent, change.called) else "continue"
    if callable(rule):
        said = rule(change)
        if said not in MOVES:
            raise ValueError(
                f"on_version_change of agent {agent.name!r} returned {said!r}, not 'continue' or 'fail'"
            )
        return said  # type: ignore[no-any-return]
    return rule  # type: ignore[no-any-return]
