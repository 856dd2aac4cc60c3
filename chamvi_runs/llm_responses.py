"""One streamed OpenAI Responses API call -> a ModelTurn, for agents with ``model_api="responses"``.

The history stays in the Chat Completions shape the engine keeps (``core.types.Message``): each call
translates it into Responses ``input`` items, and each turn back. Nothing is left on the provider
(``store=False``): a turn with reasoning keeps its output items, the reasoning's encrypted content
included, in its assistant message (``RESPONSE_ITEMS``), so the next call sends them back, in the
same execution or in any later one (after an approval, a crash, a drain).

The transport (client, retries, pump thread, server-sent events) is ``llm_openai``'s.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from .core.storable import storable
from .core.types import (
    RESPONSE_ITEMS,
    AbortSignal,
    Message,
    ModelRequest,
    ModelTurn,
    OnDelta,
    ToolCall,
    Usage,
)
from .llm_openai import Reading, client, pumped, retrying

_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_INCOMPLETE: dict[Any, str] = {"max_output_tokens": "length", "content_filter": "content_filter"}
"""Why a response is incomplete -> the Chat Completions finish reason the engine knows."""


_UNENCRYPTED: set[str] = set()
"""Models that refused to send their reasoning encrypted (this process asked): those that do not
reason (``gpt-4o``, ``gpt-4.1``) answer HTTP 400 to ``include=["reasoning.encrypted_content"]``."""


class ResponsesModel:
    """Streams the Responses API with tools, structured output and reasoning items."""

    def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        kwargs = request_body(request)
        return retrying(lambda: _stream_once(kwargs, on_delta, abort), abort)


def _stream_once(kwargs: dict[str, Any], on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
    if kwargs["model"] in _UNENCRYPTED:
        kwargs = _unencrypted(kwargs)
    turn, failure = _read(kwargs, on_delta, abort)
    if "include" in kwargs and _refuses_encryption(failure):
        # Nothing was streamed: the same call again, without, and without for this model from now on.
        _UNENCRYPTED.add(kwargs["model"])
        turn, _ = _read(_unencrypted(kwargs), on_delta, abort)
    return turn


def _unencrypted(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k != "include"}


def _refuses_encryption(failure: Exception | None) -> bool:
    body = getattr(failure, "body", None)
    return (
        getattr(failure, "status_code", None) == 400
        and isinstance(body, dict)
        and body.get("param") == "include"
    )


def _read(
    kwargs: dict[str, Any], on_delta: OnDelta, abort: AbortSignal
) -> tuple[ModelTurn, Exception | None]:
    turn = ModelTurn()
    output = _Output()
    with Reading(turn) as reading:
        # Each event is the JSON object the provider sent, as in ``llm_openai``: no client objects.
        for event in pumped(client().responses.with_streaming_response.create, kwargs, abort):
            reading.received = True
            kind = event.get("type")
            if kind in _TEXT_DELTAS or kind in _REASONING_DELTAS:
                # A lone surrogate cannot be stored or sent on: replaced, deltas still add up.
                delta = storable(event.get("delta"))
                if isinstance(delta, str) and delta:
                    if kind in _TEXT_DELTAS:
                        output.text.append(delta)
                        on_delta("text", delta)
                    else:
                        output.reasoning.append(delta)
                        on_delta("reasoning", delta)
            elif kind == "response.function_call_arguments.delta":
                output.argument(event.get("output_index"), event.get("delta"))
            elif kind in ("response.output_item.added", "response.output_item.done"):
                output.item(event.get("output_index"), storable(event.get("item")), kind.endswith("done"))
            elif kind in ("response.completed", "response.incomplete"):
                response = event.get("response") or {}
                turn.usage = _usage(response.get("usage"))
                if kind == "response.completed":
                    turn.finish_reason = "tool_calls" if output.calls else "stop"
                else:
                    reason = (response.get("incomplete_details") or {}).get("reason")
                    turn.finish_reason = _INCOMPLETE.get(reason) or str(reason or "length")
            elif kind == "response.failed":
                response = event.get("response") or {}
                turn.usage = _usage(response.get("usage"))
                turn.error = _error_text(response.get("error"), "the response failed")
            elif kind == "error":
                turn.error = _error_text(event, "an error occurred during streaming")
    output.finish(turn)
    return turn, reading.failure


@dataclass
class _Call:
    id: Any
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Output:
    """A turn's output as it streams: text, reasoning, calls by output index, the finished items."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    reasoned: bool = False

    def argument(self, index: Any, delta: Any) -> None:
        call = self.calls.get(index)
        if call is not None and isinstance(delta, str):
            call.arguments.append(storable(delta))

    def item(self, index: Any, item: Any, done: bool) -> None:
        if not isinstance(item, dict) or not isinstance(index, int):
            return
        kind = item.get("type")
        if kind == "function_call":
            call = self.calls.setdefault(index, _Call(item.get("call_id")))
            call.name = item.get("name") or call.name
            arguments = item.get("arguments")
            if done and isinstance(arguments, str):
                call.arguments = [arguments]  # the whole arguments: what the deltas were parts of
            elif not call.arguments and arguments:
                call.arguments.append(arguments)
            self.items[index] = {"type": "function_call", "id": item.get("id")}
        elif done and kind in ("reasoning", "message"):
            # Only the finished item: the encrypted content of one just added may be incomplete.
            self.items[index] = item
            self.reasoned = self.reasoned or kind == "reasoning"

    def finish(self, turn: ModelTurn) -> None:
        turn.text = "".join(self.text)
        turn.reasoning = "".join(self.reasoning)
        # Providers reuse call ids across turns (the engine never relies on them) and some repeat or
        # omit them within one: those get one of ours, so each result answers one call.
        prefix = f"call_{secrets.token_hex(6)}_"
        seen: set[str] = set()
        calls = []
        for n, (_, call) in enumerate(sorted(self.calls.items())):  # each part was made storable
            usable = isinstance(call.id, str) and call.id and call.id not in seen
            call_id = call.id if usable else f"{prefix}{n}"
            seen.add(call_id)
            calls.append(ToolCall(id=call_id, name=call.name, arguments="".join(call.arguments)))
        turn.tool_calls = calls
        if self.reasoned:
            turn.response_items = [self.items[i] for i in sorted(self.items)]


def _usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    return Usage(usage.get("input_tokens") or 0, usage.get("output_tokens") or 0)


def _error_text(error: Any, fallback: str) -> str:
    message = error.get("message") if isinstance(error, dict) else None
    text = message if isinstance(message, str) and message else fallback
    return str(storable(text))


# --- the request: a Chat Completions history -> Responses input ---------------------------------


def request_body(request: ModelRequest) -> dict[str, Any]:
    """The ``responses.create`` arguments for ``request`` (a Chat Completions request)."""
    messages = request.messages
    instructions = []
    while messages and messages[0].get("role") == "system":
        instructions.append(_text_of(messages[0].get("content")))
        messages = messages[1:]
    body: dict[str, Any] = {
        "model": request.model,
        "input": _input_items(messages),
        "stream": True,
        # Nothing is kept on the provider's side: every call carries the whole history, and the
        # reasoning comes back encrypted so it can go with it.
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    text_format = _format(request.response_format)
    if text_format is not None:
        body["text"] = {"format": text_format}
    return body


def _input_items(messages: list[Message]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            items.extend(_assistant_items(message))
        elif role == "tool":
            content = message.get("content")
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": content if isinstance(content, str) else _parts(content),
                }
            )
        else:
            content = message.get("content")
            # Instructions later in a history (none the engine writes) are the developer's.
            items.append(
                {
                    "role": "developer" if role == "system" else role,
                    "content": content if isinstance(content, str) else _parts(content),
                }
            )
    return items


def _assistant_items(message: Message) -> list[dict[str, Any]]:
    calls = [
        {
            "type": "function_call",
            "call_id": call.get("id"),
            "name": call.get("function", {}).get("name"),
            "arguments": call.get("function", {}).get("arguments") or "",
        }
        for call in message.get("tool_calls") or []
    ]
    kept = message.get(RESPONSE_ITEMS)
    if not kept:
        text = _text_of(message.get("content"))
        return ([{"role": "assistant", "content": text}] if text else []) + calls
    # The turn as the provider sent it, in its order: each reasoning item before the item it
    # preceded, with that item's id. The calls are the history's (an id may have been made unique).
    items: list[dict[str, Any]] = []
    rest = iter(calls)
    for item in kept:
        if item.get("type") == "function_call":
            call = next(rest, None)
            if call is not None:
                items.append({**call, "id": item.get("id")} if item.get("id") else call)
        else:
            items.append(item)
    items.extend(rest)
    return items


def _parts(content: Any) -> list[dict[str, Any]]:
    """Chat Completions content parts -> Responses input parts."""
    parts = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            parts.append(
                {"type": "input_image", "image_url": image.get("url"), "detail": image.get("detail", "auto")}
            )
        elif kind == "file":
            file = part.get("file") or {}
            converted = {"type": "input_file", "file_data": file.get("file_data")}
            if file.get("filename"):
                converted["filename"] = file["filename"]
            parts.append(converted)
        else:
            parts.append(part)  # already a Responses part (input_text, input_audio...)
    return parts


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return tool
    converted = {
        "type": "function",
        "name": function.get("name"),
        "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        # The Responses API makes function tools strict unless told otherwise; Chat Completions does not.
        "strict": bool(function.get("strict", False)),
    }
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def _format(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not response_format:
        return None
    if response_format.get("type") != "json_schema":
        return {"type": response_format.get("type")}
    schema = response_format.get("json_schema") or {}
    converted = {"type": "json_schema", **{k: v for k, v in schema.items() if k != "type"}}
    converted.setdefault("name", "output")
    return converted
