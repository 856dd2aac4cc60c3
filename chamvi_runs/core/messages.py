"""Building and reading Chat Completions histories."""

from __future__ import annotations

import json
from typing import Any

from .types import Message

ARTIFACT_SCHEME = "chamvi-artifact:"


def trigger_message(
    source: str, trigger: str, payload: Any, attachments: list[dict[str, str]] | None = None
) -> Message:
    """The first message of a run: the envelope's source, trigger and payload, then one file part per
    attachment. Attachments hold references only (``chamvi-artifact:<id>``); bytes are read per execution."""
    block = json.dumps({"source": source, "trigger": trigger, "payload": payload}, ensure_ascii=False)
    content: list[dict[str, Any]] = [{"type": "text", "text": block}]
    for attachment in attachments or []:
        content.append(
            {
                "type": "file",
                "file": {
                    "file_data": ARTIFACT_SCHEME + attachment["id"],
                    "filename": attachment["filename"],
                    "media_type": attachment["media_type"],
                },
            }
        )
    return {"role": "user", "content": content}


def artifact_refs(messages: list[Message]) -> list[str]:
    """Artifact ids referenced anywhere in ``messages``."""
    refs = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            data = part.get("file", {}).get("file_data", "") if part.get("type") == "file" else ""
            if isinstance(data, str) and data.startswith(ARTIFACT_SCHEME):
                refs.append(data.removeprefix(ARTIFACT_SCHEME))
    return refs


def open_tool_calls(messages: list[Message]) -> list[dict[str, Any]]:
    """Tool calls of the last assistant message that no tool message answers yet, in order."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if message.get("role") == "assistant":
            answered = {m.get("tool_call_id") for m in messages[position + 1 :] if m.get("role") == "tool"}
            return [call for call in message.get("tool_calls") or [] if call["id"] not in answered]
        if message.get("role") == "user":
            return []
    return []


def tool_result(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def answer_open_calls(messages: list[Message], reason: str) -> list[Message]:
    """A copy of ``messages`` where every open tool call gets a synthetic result, so the history can
    always be continued (by a thread's next run, for instance)."""
    return messages + [tool_result(call["id"], reason) for call in open_tool_calls(messages)]


def last_assistant_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def last_assistant(messages: list[Message]) -> Message:
    return next((m for m in reversed(messages) if m.get("role") == "assistant"), {})


def input_message(payload: Any) -> Message:
    """A steering input as the user message the model gets: text as is, other JSON encoded."""
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return {"role": "user", "content": text}


def history_before(
    run_id: str, whole: list[Any], opening_length: int | None, parts: list[Any], at: int
) -> list[Any]:
    """The history after step ``at``, cut from the ``whole`` one: ``parts`` are what steps 0 to
    ``at`` stored, each its messages or their count (a save that wrote the whole history keeps only
    the count), so the history then is a prefix of the whole one. Raises ValueError when a part or
    the opening's length was not kept (a release that stored histories whole wrote them)."""
    if opening_length is None or any(part is None for part in parts):
        raise ValueError(
            f"run {run_id}: the history after step {at} was not kept (a release that "
            "stored histories whole wrote it)"
        )
    added = sum(part if isinstance(part, int) else len(part) for part in parts)
    return whole[: opening_length + added]
