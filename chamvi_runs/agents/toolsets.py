"""Toolsets: tools an agent gets from elsewhere (an MCP server's, ``chamvi_runs.mcp``), known only
once listed. A run lists each toolset once, the first time it needs it, and records the listing
(``Run.listed_tools``): every later execution of the run, after a pause, a crash or a deploy, builds
the same tools from the record, without asking the server again."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from .tools import Tool

logger = logging.getLogger(__name__)


class ToolsetUnavailable(Exception):
    """The toolset's tools cannot be listed or built: its server is unreachable, or its listing
    does not fit what the toolset was told about it."""


class Toolset(ABC):
    name: str
    """Names the toolset's listing in the runs that record it; unique among an agent's toolsets."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the agent's version depends on (SPEC §14): the configuration, not the listing."""

    @abstractmethod
    def may_provide(self, name: str) -> bool:
        """Whether a tool named ``name`` may be one of this toolset's (before it is listed)."""

    @abstractmethod
    def list_tools(self) -> list[dict[str, Any]]:
        """The listing (JSON data), as recorded with a run. Raises ToolsetUnavailable."""

    @abstractmethod
    def build(self, listing: list[dict[str, Any]]) -> list[Tool]:
        """The tools of a listing, fresh or recorded. Raises ToolsetUnavailable."""


def assemble(
    items: Iterable[Tool | Toolset],
    recorded: Mapping[str, Any] | None,
    listed: dict[str, Any] | None,
) -> dict[str, Tool]:
    """The tools of ``items`` by name: a toolset's from its ``recorded`` listing, or listed now
    (and put in ``listed``, to be recorded; with ``listed`` None, nothing is listed: a web request
    asks only what a run recorded). A toolset that cannot be listed or built gives no tools: the
    run goes on without them, logged, and lists again next execution. A toolset's tool named like
    an earlier tool is left out: a name stands for one tool in a run's history."""
    tools: dict[str, Tool] = {}
    toolsets: list[Toolset] = []
    for item in items:
        if isinstance(item, Toolset):
            toolsets.append(item)
        else:
            tools[item.name] = item
    for toolset in toolsets:
        listing = (recorded or {}).get(toolset.name)
        if listing is None and listed is None:
            continue
        try:
            if listing is None:
                listing = toolset.list_tools()
                assert listed is not None
                listed[toolset.name] = listing
            built = toolset.build(listing)
        except ToolsetUnavailable as exc:
            if listed is not None:
                listed.pop(toolset.name, None)
            logger.error("toolset %s left out of this execution: %s", toolset.name, exc)
            continue
        for tool in built:
            if tool.name in tools:
                logger.warning(
                    "toolset %s: tool %s left out: another tool has its name", toolset.name, tool.name
                )
                continue
            tools[tool.name] = tool
    return tools
