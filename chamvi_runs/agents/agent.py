"""``Agent``: what a run executes. Constructing one registers it by name."""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pydantic
from django.core.exceptions import ImproperlyConfigured

from ..core.budget import Budget
from ..core.types import AbortSignal
from ..errors import AgentNotFound
from . import delegation, toolsets, versions
from .tools import Approval, ApprovalRule, Tool, condition_of

if TYPE_CHECKING:
    from ..models import Run, WaitPoint

MODEL_APIS = ("chat", "responses")
"""How an agent's model is called: Chat Completions (``CHAMVI_RUNS["MODEL"]``) or the Responses API
(``CHAMVI_RUNS["RESPONSES_MODEL"]``)."""


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
        tools: Sequence[Tool | Agent | toolsets.Toolset]
        | Callable[[RunContext], Sequence[Tool | toolsets.Toolset]] = (),
        approvals: dict[str, ApprovalRule] | None = None,
        approval_ttl: timedelta | None = None,
        budget: Budget | None = None,
        output: type[pydantic.BaseModel] | dict[str, Any] | None = None,
        notifier: Callable[[Run, WaitPoint], None] | None = None,
        on_approval_expired: str = "deny",
        input: type[pydantic.BaseModel] | dict[str, Any] | None = None,
        version: str | None = None,
        on_version_change: versions.VersionRule | None = None,
        model_api: str = "chat",
    ) -> None:
        if not name or not isinstance(name, str):
            raise ImproperlyConfigured("Agent name must be a non-empty string")
        if not model or not isinstance(model, str):
            raise ImproperlyConfigured(f"Agent {name}: model must be a non-empty string")
        if not (isinstance(instructions, str) or callable(instructions)):
            raise ImproperlyConfigured(f"Agent {name}: instructions must be a string or callable(ctx)")
        if on_approval_expired not in ("deny", "fail"):
            raise ImproperlyConfigured(f"Agent {name}: on_approval_expired must be 'deny' or 'fail'")
        if output is not None and not (
            isinstance(output, dict) or (isinstance(output, type) and issubclass(output, pydantic.BaseModel))
        ):
            raise ImproperlyConfigured(
                f"Agent {name}: output must be None, a pydantic model or a JSON schema"
            )
        if budget is not None and not isinstance(budget, Budget):
            raise ImproperlyConfigured(f"Agent {name}: budget must be a Budget, not {budget!r}")
        if isinstance(approval_ttl, int | float) and not isinstance(approval_ttl, bool):
            approval_ttl = timedelta(seconds=approval_ttl)
        if approval_ttl is not None and not (
            isinstance(approval_ttl, timedelta) and approval_ttl > timedelta(0)
        ):
            raise ImproperlyConfigured(
                f"Agent {name}: approval_ttl must be a positive timedelta or number of seconds"
            )
        if notifier is not None and not callable(notifier):
            raise ImproperlyConfigured(f"Agent {name}: notifier must be callable(run, waitpoint)")
        if model_api not in MODEL_APIS:
            raise ImproperlyConfigured(
                f"Agent {name}: model_api must be one of {', '.join(map(repr, MODEL_APIS))}, "
                f"not {model_api!r}"
            )
        if version is not None and not (isinstance(version, str) and 0 < len(version) <= 64):
            raise ImproperlyConfigured(f"Agent {name}: version must be a string of 1 to 64 characters")
        if on_version_change is not None and not (
            on_version_change in versions.MOVES or callable(on_version_change)
        ):
            raise ImproperlyConfigured(
                f"Agent {name}: on_version_change must be 'continue', 'fail' or callable(change)"
            )
        self._version = version
        self.on_version_change = on_version_change
        try:
            self.input_model = delegation.input_model(name, input)
        except TypeError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        if not callable(tools):
            if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
                raise ImproperlyConfigured(f"Agent {name}: tools must be a list of tools or callable(ctx)")
            # An agent among the tools is delegated to (``as_tool``); a generator would be empty
            # after these checks.
            tools = tuple(_as_tool(name, t) if isinstance(t, Agent) else t for t in tools)
            seen: set[str] = set()
            sets: set[str] = set()
            for t in tools:
                if isinstance(t, toolsets.Toolset):
                    if t.name in sets:
                        raise ImproperlyConfigured(f"Agent {name}: two toolsets are named {t.name!r}")
                    sets.add(t.name)
                    continue
                if not isinstance(t, Tool):
                    raise ImproperlyConfigured(
                        f"Agent {name}: {t!r} is not a @tool, an @effect_tool, an agent or mcp_tools()"
                    )
                if t.name in seen:
                    raise ImproperlyConfigured(f"Agent {name}: two tools are named {t.name!r}")
                seen.add(t.name)
        rules: dict[str, Approval] = {
            tool_name: _rule(name, tool_name, rule) for tool_name, rule in (approvals or {}).items()
        }
        for tool_name in rules:
            # A misspelt name would silently run the tool without approval.
            if not callable(tools) and tool_name not in {t.name for t in tools if isinstance(t, Tool)}:
                raise ImproperlyConfigured(
                    f"Agent {name}: approvals names {tool_name!r}, which is not one of its tools"
                    + (
                        " (the approvals of an MCP server's tools go in its mcp_tools(approvals=...))"
                        if any(isinstance(t, toolsets.Toolset) for t in tools)
                        else ""
                    )
                )
            if not callable(tools) and any(
                isinstance(t, Tool) and t.name == tool_name and t.question for t in tools
            ):
                raise ImproperlyConfigured(
                    f"Agent {name}: {tool_name!r} is a human_tool: its user answers it, nobody approves it"
                )
        self.name = name
        self.model = model
        self.model_api = model_api
        self.instructions = instructions
        self.tools = tools
        self.approvals = rules
        self.approval_ttl = approval_ttl
        self.budget = budget or Budget()
        self.output = output
        self.notifier = notifier
        self.on_approval_expired = on_approval_expired
        registry.register(self)

    def __repr__(self) -> str:
        return f"<Agent {self.name}>"

    @functools.cached_property
    def version(self) -> str:
        """The agent's version (SPEC §14): ``Agent(version=...)``, or a hash of what its runs depend
        on (``versions.derived``). Every run records the version it started with."""
        return self._version or versions.derived(self)

    def as_tool(self, name: str | None = None, description: str | None = None) -> Tool:
        """This agent as another agent's tool: a call starts a child run of it (SPEC §13), whose
        trigger payload is the call's arguments (``{"task": ...}`` unless ``input`` says
        otherwise); the caller waits without holding a worker, and the child's output, or its
        error, is the call's result."""
        return delegation.delegating_tool(self.name, self.instructions, self.input_model, name, description)

    def render_instructions(self, ctx: RunContext) -> str:
        return self.instructions(ctx) if callable(self.instructions) else self.instructions

    def assemble_tools(self, ctx: RunContext, listed: dict[str, Any] | None = None) -> dict[str, Tool]:
        """The run's tools by name. A toolset's come from the listing the run recorded, or are
        listed now into ``listed``, for the caller (an execution) to record; without ``listed``
        (a web request), only the recorded ones."""
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        plain = [t for t in tools if isinstance(t, Tool)]
        if len(plain) == len(tools):
            return {t.name: t for t in plain}
        return toolsets.assemble(tools, ctx.run.listed_tools, listed)

    def rule(self, tool: Tool) -> Approval | None:
        """The approval rule of ``tool``: the agent's, or the one it came with (an MCP server's)."""
        return self.approvals.get(tool.name) or tool.approval

    def needs_approval(self, tool: Tool, arguments: dict[str, Any], ctx: RunContext) -> bool:
        rule = self.rule(tool)
        if rule is None:
            return False
        return bool(rule.when(arguments, ctx)) if callable(rule.when) else rule.when

    def editable(self, tool: Tool) -> bool:
        """Whether an approver may change the arguments of ``tool`` before approving."""
        rule = self.rule(tool)
        return rule is None or rule.editable

    def response_format(self) -> dict[str, Any] | None:
        """The ``response_format`` for structured output (a fresh copy: callers may change it)."""
        return copy.deepcopy(self._response_format)

    @functools.cached_property
    def _response_format(self) -> dict[str, Any] | None:
        # A pydantic JSON schema is costly to build and the agent's output never changes.
        if self.output is None:
            return None
        if isinstance(self.output, dict):
            schema, name = self.output, self.output.get("title") or "output"
        else:
            schema, name = self.output.model_json_schema(), self.output.__name__
        # The API wants the name to match ^[a-zA-Z0-9_-]{1,64}$; a schema title may hold spaces.
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", str(name))[:64] or "output"
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}

    def parse_output(self, text: str) -> Any:
        """The final answer as stored in ``Run.output``; raises ValueError when it does not fit."""
        if self.output is None:
            return text
        if isinstance(self.output, dict):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"output is not JSON: {exc}") from None
            expected = self.output.get("type")
            if isinstance(expected, str) and expected in _JSON_TYPES and not _JSON_TYPES[expected](value):
                raise ValueError(f"output must be a JSON {expected}")
            missing = [
                k for k in self.output.get("required", []) if not isinstance(value, dict) or k not in value
            ]
            if missing:
                raise ValueError(f"output misses required keys: {', '.join(missing)}")
            return value
        try:
            return self.output.model_validate_json(text).model_dump(mode="json")
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(
                f"output does not match {self.output.__name__}: {where + ': ' if where else ''}{first['msg']}"
            ) from None


def _as_tool(agent: str, child: Agent) -> Tool:
    try:
        return child.as_tool()
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"Agent {agent}: agent {child.name!r} cannot be a tool under its own name ({exc}); "
            "use its as_tool(name=...)"
        ) from None


def _rule(agent: str, tool_name: str, rule: Any) -> Approval:
    try:
        return condition_of(rule)
    except ValueError as exc:
        raise ImproperlyConfigured(f"Agent {agent}: approvals[{tool_name!r}] {exc}") from None


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


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

    def versions(self) -> dict[str, str]:
        """Each agent's version: what this process executes (SPEC §14)."""
        with self._lock:
            agents = list(self._agents.values())
        return {agent.name: agent.version for agent in agents}


registry = AgentRegistry()
