"""An MCP tool result as a chamvi tool's output or error."""

from __future__ import annotations

from typing import Any


def outcome(result: Any) -> tuple[Any, str]:
    """``(output, error)`` of a ``CallToolResult``: its structured content when it has one, else its
    text; an ``isError`` result is the tool's error, which the model sees. Images, audio and
    embedded resources are described, not copied: their bytes would fill the history."""
    parts = [_part(block) for block in result.content or []]
    text = "\n".join(part for part in parts if isinstance(part, str))
    if result.is_error:
        return None, text or "the tool reported an error"
    if result.structured_content is not None:
        return result.structured_content, ""
    if all(isinstance(part, str) for part in parts):
        return text, ""
    return parts, ""


def _part(block: Any) -> str | dict[str, Any]:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return {"type": kind, "mime_type": getattr(block, "mime_type", "")}
    if kind == "resource_link":
        return {"type": kind, "uri": str(block.uri), "name": getattr(block, "name", "")}
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        return {"type": kind, "uri": str(resource.uri), "mime_type": getattr(resource, "mime_type", "")}
    return {"type": kind or "unknown"}
