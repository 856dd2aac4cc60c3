"""``Agent``: what a run executes. Constructing one registers it by name."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pydantic
from django.core.exceptions import ImproperlyConfigured

from .core.budget import Budget
from .core.types import AbortSignal
from .errors import AgentNotFound
from .tools import Tool

if TYPE_CHECKING:
    from .models import Run, WaitPoint

ApprovalRule = bool | Callable[[dict[str, Any], "RunContext"], bool]


@dataclass
class RunContext:
    """What instructions, tool factories, approval rules and tools receive as ``ctx``."""

    run: Run
    agent: Agent
    abort: AbortSignal = field(default_factory=AbortSignal)
    step_index: int | None = None
    tool_call_id: str | None = None
    idempotency_key: str | None = None
    """Set for effect tools: stable across re-executions of the same step and call position."""


class Agent:
    def __init__(
        self,
        name: str,
        model: str,
        instructions: str | Callable[[RunContext], str] = "",
        tools: Sequence[Tool] | Callable[[RunContext], Sequence[Tool]] = (),
        approvals: dict[str, ApprovalRule] | None = None,
        approval_ttl: timedelta | None = None,
        budget: Budget | None = None,
        output: type[pydantic.BaseModel] | dict[str, Any] | None = None,
        notifier: Callable[[Run, WaitPoint], None] | None = None,
        on_approval_expired: str = "deny",
    ) -> None:
        if not name or not isinstance(name, str):
            raise ImproperlyConfigured("Agent name must be a non-empty string")
        if on_approval_expired not in ("deny", "fail"):
            raise ImproperlyConfigured(f"Agent {name}: on_approval_expired must be 'deny' or 'fail'")
        if output is not None and not (
            isinstance(output, dict) or (isinstance(output, type) and issubclass(output, pydantic.BaseModel))
        ):
            raise ImproperlyConfigured(
                f"Agent {name}: output must be None, a pydantic model or a JSON schema"
            )
        if not callable(tools):
            for t in tools:
                if not isinstance(t, Tool):
                    raise ImproperlyConfigured(f"Agent {name}: {t!r} is not a @tool or @effect_tool")
        self.name = name
        self.model = model
        self.instructions = instructions
        self.tools = tools
        self.approvals = dict(approvals or {})
        self.approval_ttl = approval_ttl
        self.budget = budget or Budget()
        self.output = output
        self.notifier = notifier
        self.on_approval_expired = on_approval_expired
        registry.register(self)

    def __repr__(self) -> str:
        return f"<Agent {self.name}>"

    def render_instructions(self, ctx: RunContext) -> str:
        return self.instructions(ctx) if callable(self.instructions) else self.instructions

    def assemble_tools(self, ctx: RunContext) -> dict[str, Tool]:
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        return {t.name: t for t in tools}

    def needs_approval(self, tool_name: str, arguments: dict[str, Any], ctx: RunContext) -> bool:
        rule = self.approvals.get(tool_name, False)
        return bool(rule(arguments, ctx)) if callable(rule) else bool(rule)

    def response_format(self) -> dict[str, Any] | None:
        if self.output is None:
            return None
        if isinstance(self.output, dict):
            schema, name = self.output, self.output.get("title", "output")
        else:
            schema, name = self.output.model_json_schema(), self.output.__name__
        return {"type": "json_schema", "json_schema": {"name": str(name)[:64], "schema": schema}}

    def parse_output(self, text: str) -> Any:
        """The final answer as stored in ``Run.output``; raises ValueError when it does not fit."""
        if self.output is None:
            return text
        if isinstance(self.output, dict):
            import json

            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"output is not JSON: {exc}") from None
            expected = self.output.get("type")
            if expected == "object" and not isinstance(value, dict):
                raise ValueError("output must be a JSON object")
            missing = [
                k for k in self.output.get("required", []) if not isinstance(value, dict) or k not in value
            ]
            if missing:
                raise ValueError(f"output misses required keys: {', '.join(missing)}")
            return value
        try:
            return self.output.model_validate_json(text).model_dump(mode="json")
        except pydantic.ValidationError as exc:
            raise ValueError(
                f"output does not match {self.output.__name__}: {exc.errors()[0]['msg']}"
            ) from None


class AgentRegistry:
    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._lock = threading.Lock()

    def register(self, agent: Agent) -> None:
        with self._lock:
            if agent.name in self._agents:
                raise ImproperlyConfigured(f"Two agents are named {agent.name!r}; agent names must be unique")
            self._agents[agent.name] = agent

    def unregister(self, name: str) -> None:
        with self._lock:
            self._agents.pop(name, None)

    def get(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            raise AgentNotFound(f"No agent named {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._agents)


registry = AgentRegistry()
