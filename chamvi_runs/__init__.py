"""chamvi_runs: durable LLM tool-loop agent runs for Django."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .agents.questions import human_tool
from .agents.tools import Approval, effect_tool, tool
from .core.budget import Budget

if TYPE_CHECKING:
    from .agents.agent import Agent, RunContext
    from .agents.versions import VersionChange
    from .api import answer, approve, cancel_run, deny, regenerate, resend, send_input, start_run

__all__ = [
    "Agent",
    "Approval",
    "Budget",
    "RunContext",
    "VersionChange",
    "answer",
    "approve",
    "cancel_run",
    "deny",
    "effect_tool",
    "human_tool",
    "regenerate",
    "resend",
    "send_input",
    "start_run",
    "tool",
]

_LAZY = {
    "Agent": "agents.agent",
    "answer": "api",
    "RunContext": "agents.agent",
    "VersionChange": "agents.versions",
    "approve": "api",
    "cancel_run": "api",
    "deny": "api",
    "regenerate": "api",
    "resend": "api",
    "send_input": "api",
    "start_run": "api",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: these touch Django settings and models, which must not load before
    # the app registry is ready (``from chamvi_runs import tool`` works in any module).
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
