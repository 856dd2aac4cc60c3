"""``@tool`` and ``@effect_tool``: plain functions described and validated from their type hints."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints, overload

import pydantic

from .errors import ToolArgumentsError


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[pydantic.BaseModel]
    takes_ctx: bool
    effect: bool = False
    """Effect tools run their side effect at most once per run and tool call (see docs/effects.md)."""

    def schema(self) -> dict[str, Any]:
        parameters = self.args_model.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse and validate the model's JSON arguments; ToolArgumentsError says what is wrong."""
        try:
            raw = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(f"arguments are not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ToolArgumentsError("arguments must be a JSON object")
        try:
            parsed = self.args_model.model_validate(raw)
        except pydantic.ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {details}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    def invoke(self, ctx: Any, arguments: dict[str, Any]) -> Any:
        if self.takes_ctx:
            return self.fn(ctx, **arguments)
        return self.fn(**arguments)


def _build(fn: Callable[..., Any], *, name: str | None, description: str | None, effect: bool) -> Tool:
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {fn!r}")
    signature = inspect.signature(fn)
    hints = get_type_hints(fn)
    params = list(signature.parameters.values())
    takes_ctx = bool(params) and params[0].name == "ctx"
    if effect and not takes_ctx:
        raise TypeError(f"effect tool {fn.__name__} must take ctx as its first parameter")
    fields: dict[str, Any] = {}
    for param in params[1:] if takes_ctx else params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    args_model = pydantic.create_model(
        f"{fn.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return Tool(
        name=name or fn.__name__,
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
    """A tool's return value as JSON data (pydantic models dumped, everything else through json)."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))
