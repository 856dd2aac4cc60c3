"""``mcp_tools``: the tools of an MCP server, as one agent's toolset (``agents.toolsets``).

Each server tool becomes a ``Tool`` like a Python one: its arguments are validated against the
server's JSON schema before anything runs (an invalid call is the model's to fix, the server never
sees it), it may need approval, and one named in ``effects`` runs through the effect record: at most
once per run and call, with the call's idempotency key sent in the request's ``_meta``
(``chamvi-runs/idempotency-key``) so the server can deduplicate what the record cannot cover (a
crash between the server's work and the record's commit). A server that is down or slow is the
call's error, which the model sees; it never holds the run."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydantic
from django.core.exceptions import ImproperlyConfigured

from ..agents.tools import Approval, ApprovalRule, Tool, arguments_object, check_tool_name, condition_of
from ..agents.toolsets import Toolset, ToolsetUnavailable
from ..errors import ToolArgumentsError

if TYPE_CHECKING:
    from .connection import Session

logger = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "chamvi-runs/idempotency-key"
"""The ``_meta`` key of an effect call's idempotency key (MCP's ``prefix/name`` form)."""


class MCPUnavailable(Exception):
    """The server could not be reached or did not answer in time (the call's error)."""


class MCPToolError(Exception):
    """The server ran the tool and it reported an error (the call's error)."""


class _Unused(pydantic.BaseModel):
    """An MCP tool's arguments are checked against the server's JSON schema, not a model."""


@dataclass(frozen=True)
class MCPTool(Tool):
    remote_name: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    toolset: MCPTools | None = None

    @functools.cached_property
    def _schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }

    @functools.cached_property
    def _validator(self) -> Any:
        import jsonschema

        cls = jsonschema.validators.validator_for(self.input_schema)
        return cls(self.input_schema, format_checker=cls.FORMAT_CHECKER)

    def validate(self, arguments: str) -> dict[str, Any]:
        raw = arguments_object(arguments)
        try:
            error = max(self._validator.iter_errors(raw), key=_depth, default=None)
        except Exception as exc:
            # A schema that passed the meta-schema may still fail on a value (a "pattern" that
            # is no regular expression here, a $ref to nowhere): the call cannot be checked.
            raise ToolArgumentsError(
                f"{self.name}: its schema cannot check these arguments ({exc})"
            ) from None
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "(root)"
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {where}: {error.message}")
        return raw

    def invoke(self, ctx: Any, arguments: dict[str, Any]) -> Any:
        assert self.toolset is not None
        return self.toolset.call(self.remote_name, arguments, ctx.idempotency_key if self.effect else None)


def _depth(error: Any) -> int:
    # The deepest error names the field at fault, not the object around it.
    return len(error.absolute_path)


class MCPTools(Toolset):
    """The tools of one MCP server (``mcp_tools``)."""

    def __init__(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        only: Iterable[str] | None = None,
        effects: Iterable[str] | bool = (),
        approvals: Mapping[str, ApprovalRule] | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        where = f"mcp_tools({name!r})"
        if not isinstance(name, str) or not name:
            raise ImproperlyConfigured("mcp_tools needs a name: it names the server's tools in every run")
        if (command is None) == (url is None):
            raise ImproperlyConfigured(f"{where}: give either command= (stdio) or url= (streamable HTTP)")
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(a, str) for a in command)
        ):
            raise ImproperlyConfigured(f"{where}: command must be a non-empty list of strings")
        if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise ImproperlyConfigured(f"{where}: url must be an http:// or https:// URL")
        if (env or headers) and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in {**(env or {}), **(headers or {})}.items()
        ):
            raise ImproperlyConfigured(f"{where}: env and headers must map strings to strings")
        for label, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ImproperlyConfigured(f"{where}: {label} must be a positive number of seconds")
        if not isinstance(prefix, str):
            raise ImproperlyConfigured(f"{where}: prefix must be a string")
        self.name = name
        self.command = tuple(command or ())
        self.url = url or ""
        self.env = dict(env or {})
        self.cwd = cwd
        self.headers = dict(headers or {})
        self.prefix = prefix
        self.only = None if only is None else frozenset(_names(where, "only", only))
        self.all_effects = effects is True
        self.effects = (
            frozenset() if isinstance(effects, bool) else frozenset(_names(where, "effects", effects))
        )
        self.approvals: dict[str, Approval] = {}
        for tool_name, rule in (approvals or {}).items():
            try:
                self.approvals[tool_name] = condition_of(rule)
            except ValueError as exc:
                raise ImproperlyConfigured(f"{where}: approvals[{tool_name!r}] {exc}") from None
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)

    def __repr__(self) -> str:
        return f"<mcp_tools {self.name}>"

    def describe(self) -> dict[str, Any]:
        # Never env or headers: they hold secrets, and a rotated token changes no run.
        return {
            "mcp": self.name,
            "command": list(self.command),
            "url": self.url,
            "prefix": self.prefix,
            "only": sorted(self.only) if self.only is not None else None,
            "effects": True if self.all_effects else sorted(self.effects),
            "approvals": sorted(self.approvals),
        }

    def may_provide(self, name: str) -> bool:
        return name.startswith(self.prefix) and (self.only is None or name[len(self.prefix) :] in self.only)

    def list_tools(self) -> list[dict[str, Any]]:
        from .connection import Refused, Unreachable

        try:
            listing = self.session().list_tools()
        except Unreachable as exc:
            raise ToolsetUnavailable(f"MCP server {self.name!r} is unreachable: {exc}") from None
        except Refused as exc:
            raise ToolsetUnavailable(f"MCP server {self.name!r} could not list its tools: {exc}") from None
        served = {tool["name"] for tool in listing}
        # A misspelt name would let a tool run without its approval, or twice: nothing of the
        # server is offered until its configuration and its listing agree.
        named = (self.only or frozenset()) | self.effects | set(self.approvals)
        missing = sorted(named - served)
        if missing:
            raise ToolsetUnavailable(
                f"MCP server {self.name!r} lists no tool named {', '.join(map(repr, missing))} "
                "(named in mcp_tools' only, effects or approvals)"
            )
        return [tool for tool in listing if self.only is None or tool["name"] in self.only]

    def build(self, listing: list[dict[str, Any]]) -> list[Tool]:
        import jsonschema

        tools: list[Tool] = []
        for described in listing:
            remote = described["name"]
            schema = described.get("input_schema") or {"type": "object"}
            try:
                name = check_tool_name(self.prefix + remote)
                # A schema no validator can use would fail every call, and a provider refuses
                # every request that describes it: the tool is left out, not the run failed.
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except (ValueError, jsonschema.SchemaError) as exc:
                logger.warning("mcp_tools(%r): tool %s left out: %s", self.name, remote, exc)
                continue
            tools.append(
                MCPTool(
                    name=name,
                    description=described.get("description") or "",
                    fn=self.call,
                    args_model=_Unused,
                    takes_ctx=True,
                    effect=self.all_effects or remote in self.effects,
                    approval=self.approvals.get(remote),
                    remote_name=remote,
                    input_schema=schema,
                    toolset=self,
                )
            )
        return tools

    def call(self, remote_name: str, arguments: dict[str, Any], idempotency_key: str | None) -> Any:
        """Run a tool on the server: its output, or MCPUnavailable / MCPToolError."""
        from .connection import Refused, Unreachable
        from .results import outcome

        meta = {IDEMPOTENCY_KEY: idempotency_key} if idempotency_key else None
        try:
            result = self.session().call_tool(remote_name, arguments, meta)
        except Unreachable as exc:
            raise MCPUnavailable(
                f"MCP server {self.name!r}: {exc}; whether {remote_name} ran there is unknown"
            ) from None
        except Refused as exc:
            raise MCPToolError(f"MCP server {self.name!r} refused {remote_name}: {exc}") from None
        output, error = outcome(result)
        if error:
            raise MCPToolError(error)
        return output

    def close(self) -> None:
        """End this process's session with the server (a stdio server's process exits), for every
        toolset of the process that names the same server; the next listing or call connects again,
        to the server as it is then."""
        self.session().close()

    def session(self) -> Session:
        from .connection import Target, session_for

        target = Target(
            command=self.command,
            env=tuple(self.env.items()),
            cwd=self.cwd,
            url=self.url,
            headers=tuple(self.headers.items()),
        )
        return session_for(target, self.timeout, self.connect_timeout)


def _names(where: str, label: str, names: Iterable[str]) -> list[str]:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ImproperlyConfigured(f"{where}: {label} must be a list of the server's tool names")
    return list(names)
