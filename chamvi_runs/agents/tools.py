"""``@tool`` and ``@effect_tool``: plain functions described and validated from their type hints."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, get_type_hints, overload

import pydantic
import pydantic_core
from django.core.exceptions import ImproperlyConfigured

from ..core.storable import storable
from ..errors import InvalidAnswer, ToolArgumentsError

Condition = bool | Callable[[dict[str, Any], Any], bool]
"""A bool, or ``callable(input, ctx)`` of a call's arguments and its ``RunContext`` (``agents.agent``,
above this module)."""


@dataclass(frozen=True)
class Approval:
    """A tool's approval rule, as a value of ``Agent(approvals={...})``: ``when`` it is asked for (a
    bool or ``callable(input, ctx)``), and whether the approver may change the arguments before
    approving (``editable``)."""

    when: Condition = True
    editable: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.when, bool) or callable(self.when)):
            raise ImproperlyConfigured("Approval(when=...) must be a bool or callable(input, ctx)")
        if not isinstance(self.editable, bool):
            raise ImproperlyConfigured("Approval(editable=...) must be a bool")


ApprovalRule = Condition | Approval


def condition_of(rule: Any) -> Approval:
    """An ``approvals`` value as an Approval; ValueError says what it should have been."""
    if isinstance(rule, Approval):
        return rule
    if not (isinstance(rule, bool) or callable(rule)):
        raise ValueError("must be a bool, callable(input, ctx) or Approval")
    return Approval(when=rule)


@dataclass(frozen=True)
class Question:
    """What makes a ``Tool`` a question: how its answer is checked, and how long it waits."""

    answer_type: Any
    ttl: timedelta | None
    client: bool

    @functools.cached_property
    def _adapter(self) -> pydantic.TypeAdapter[Any] | None:
        return None if self.answer_type is None else pydantic.TypeAdapter(self.answer_type)

    @functools.cached_property
    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON Schema a page builds its answer form from (None: any JSON value)."""
        return None if self._adapter is None else self._adapter.json_schema()

    def validate(self, answer: Any) -> Any:
        """The answer as JSON data, or InvalidAnswer naming the field that does not fit."""
        if self._adapter is None:
            return answer
        try:
            # Python mode, not JSON mode: the answer was already decoded, and a model instance
            # passed from Python is taken as it is.
            value = self._adapter.validate_python(answer)
        except pydantic.ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            )
            raise InvalidAnswer(f"answer: {details}", code="invalid_answer") from None
        return to_jsonable(value)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[pydantic.BaseModel]
    takes_ctx: bool
    effect: bool = False
    """Effect tools run their side effect at most once per run and tool call (see docs/effects.md)."""
    question: Question | None = None
    """Set for ``human_tool``: a call asks the run's user, and the answer is its result."""
    delegate: str | None = None
    """Set for an agent as a tool (``Agent.as_tool``): the agent a call starts a child run of."""
    approval: Approval | None = None
    """The approval rule the tool comes with (an MCP server's tools get theirs from ``mcp_tools``);
    the agent's ``approvals`` take precedence."""

    def schema(self) -> dict[str, Any]:
        """The Chat Completions tool definition (a fresh copy: callers may change it)."""
        return copy.deepcopy(self._schema)

    @functools.cached_property
    def _schema(self) -> dict[str, Any]:
        # Building a JSON schema is costly and the tool never changes: once per tool, not per call.
        parameters = self.args_model.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse and validate the model's JSON arguments; ToolArgumentsError says what is wrong."""
        raw = arguments_object(arguments)
        try:
            parsed = self.args_model.model_validate(raw)
        except pydantic.ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {details}") from None
        fields = type(parsed).model_fields
        values = {field.alias or name: getattr(parsed, name) for name, field in fields.items()}
        # A model that takes keys beyond its fields (a delegation's JSON-schema input) keeps them.
        return {**(parsed.model_extra or {}), **values}

    def invoke(self, ctx: Any, arguments: dict[str, Any]) -> Any:
        if self.takes_ctx:
            return self.fn(ctx, **arguments)
        return self.fn(**arguments)


def arguments_object(arguments: str) -> dict[str, Any]:
    """The model's JSON arguments of a call, which must be an object (none: an empty one)."""
    try:
        raw = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolArgumentsError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ToolArgumentsError("arguments must be a JSON object")
    return raw


_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def check_tool_name(tool_name: Any) -> str:
    if not isinstance(tool_name, str) or not _TOOL_NAME.fullmatch(tool_name):
        # The Chat Completions API rejects every request that describes a tool with another name.
        raise ValueError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'")
    return tool_name


def _build(fn: Callable[..., Any], *, name: str | None, description: str | None, effect: bool) -> Tool:
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {fn!r}")
    tool_name = check_tool_name(name or getattr(fn, "__name__", ""))
    signature = inspect.signature(fn)
    try:
        # include_extras keeps Annotated[..., Field(description=..., ge=...)] for pydantic.
        hints = get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {tool_name}: cannot resolve its type hints ({exc})") from None
    params = list(signature.parameters.values())
    takes_ctx = bool(params) and params[0].name == "ctx"
    if effect and not takes_ctx:
        raise TypeError(f"effect tool {tool_name} must take ctx as its first parameter")
    fields: dict[str, Any] = {}
    for param in params[1:] if takes_ctx else params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name}: *args and **kwargs cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name}: positional-only parameter {param.name} cannot be named")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        # Fields get neutral names and the parameter's name as alias: a parameter may then be called
        # json, schema, copy, model_config or _hidden without clashing with BaseModel's own names.
        fields[f"arg_{len(fields)}"] = (
            annotation,
            pydantic.Field(default, alias=param.name, title=param.name.replace("_", " ").strip().title()),
        )
    args_model = pydantic.create_model(
        f"{tool_name}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return Tool(
        name=tool_name,
        description=description if description is not None else inspect.cleandoc(fn.__doc__ or ""),
        fn=fn,
        args_model=args_model,
        takes_ctx=takes_ctx,
        effect=effect,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None
) -> Any:
    """Make a function a tool. Its docstring is the description; its type hints the argument schema.
    A first parameter named ``ctx`` receives the ToolContext."""
    if fn is not None:
        return _build(fn, name=name, description=description, effect=False)
    return lambda f: _build(f, name=name, description=description, effect=False)


@overload
def effect_tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def effect_tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...
def effect_tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None
) -> Any:
    """A tool with a side effect: its result is recorded durably and a repeat returns the record."""
    if fn is not None:
        return _build(fn, name=name, description=description, effect=True)
    return lambda f: _build(f, name=name, description=description, effect=True)


def to_jsonable(value: Any) -> Any:
    """A value (a tool's arguments or result) as JSON data: pydantic models dumped, also inside lists and
    dicts, datetimes, dates, UUIDs and decimals as their ISO/str form, sets and tuples as lists, NaN and
    infinities as null (PostgreSQL's jsonb has no such numbers), anything else as ``str()``; text
    PostgreSQL cannot store replaced (``core.storable``)."""
    try:
        data = pydantic_core.to_jsonable_python(value, fallback=str)
    except pydantic_core.PydanticSerializationError:
        data = value
    # What a tool got or gave is streamed and stored: a NUL or lone surrogate in it becomes U+FFFD.
    return storable(json.loads(json.dumps(data, default=str), parse_constant=lambda _constant: None))
