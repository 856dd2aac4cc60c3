"""Delegation (SPEC §13): an agent as another agent's tool. Calling it starts a child run of that
agent, whose trigger payload is the call's arguments; the parent waits for it without holding a
worker, and the child's output (or its error) is the call's result."""

from __future__ import annotations

import copy
from typing import Any

import pydantic

from .tools import Tool, check_tool_name


class Task(pydantic.BaseModel):
    """What a child agent is handed by default: one task, in words."""

    model_config = pydantic.ConfigDict(extra="forbid")
    task: str = pydantic.Field(description="The task to hand over, with everything needed to do it.")


def input_model(agent: str, declared: Any) -> type[pydantic.BaseModel]:
    """The arguments a call to ``agent`` as a tool takes: ``Task`` (None), the declared pydantic
    model, or a model checking a JSON schema's object type and required keys (the schema itself is
    what the model is shown)."""
    if declared is None:
        return Task
    if isinstance(declared, type) and issubclass(declared, pydantic.BaseModel):
        return declared
    if isinstance(declared, dict):
        return _schema_model(agent, declared)
    raise TypeError(f"Agent {agent}: input must be None, a pydantic model or a JSON schema")


def _schema_model(agent: str, schema: dict[str, Any]) -> type[pydantic.BaseModel]:
    if schema.get("type", "object") != "object":
        raise TypeError(f"Agent {agent}: an input schema describes an object (a tool's arguments)")
    required = [key for key in schema.get("required", []) if isinstance(key, str)]
    shown = copy.deepcopy(schema)

    class Arguments(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")

        @pydantic.model_validator(mode="after")
        def _has_required(self) -> Arguments:
            missing = [key for key in required if key not in (self.model_extra or {})]
            if missing:
                raise ValueError(f"missing required keys: {', '.join(missing)}")
            return self

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(shown)

    Arguments.__name__ = f"{agent}_input"
    return Arguments


def _never_called(**_: Any) -> Any:
    raise AssertionError("a delegation starts a child run, it is never run in the parent")


def delegating_tool(
    agent: str,
    instructions: Any,
    arguments: type[pydantic.BaseModel],
    name: str | None = None,
    description: str | None = None,
) -> Tool:
    """``Agent.as_tool``: the tool that starts a child run of ``agent``, named after it (or
    ``name``), described by ``description`` or the first line of its ``instructions`` (when they
    are a string), taking ``arguments`` (the agent's ``input``)."""
    tool_name = check_tool_name(name or agent)
    if description is None:
        lines = instructions.strip().splitlines() if isinstance(instructions, str) else []
        description = f"Hand a task to the {agent} agent." + (f" {lines[0]}" if lines else "")
    return Tool(
        name=tool_name,
        description=description,
        fn=_never_called,
        args_model=arguments,
        takes_ctx=False,
        delegate=agent,
    )
