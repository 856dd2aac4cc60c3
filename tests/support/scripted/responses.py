"""The Responses API side of the scripted server: a scripted ``Reply`` as Responses streaming events,
and a Responses request read back as the Chat Completions request it stands for.

The same ``Reply`` serves both APIs, so one test script runs an agent on either adapter:

* consecutive ``text`` events are one output message (``response.output_text.delta`` each),
  consecutive ``reasoning`` events one reasoning item (``response.reasoning_summary_text.delta``
  each; its ``encrypted_content`` is ``sealed(summary)``), each ``tool_call`` one ``function_call``
  item (``call_id`` is the scripted id; arguments streamed in ``chunks`` deltas; ``index`` unused);
* ``finish(reason)`` ends the response where it stands: ``response.completed``, or, for ``length``
  and ``content_filter``, ``response.incomplete`` (``max_output_tokens`` / ``content_filter``),
  carrying the reply's ``usage``; a reply without ``finish`` sends neither (a response that never
  ends, like a chat stream without a finish reason);
* ``error_event`` is an ``error`` event, then the stream ends; ``cut``, ``delay``, ``http_error``
  and ``raw`` (a ``data:`` line as is) behave as for Chat Completions.

What the server records of a Responses request is ``chat_view(body)``: the Chat Completions
request with the same history (``messages``, ``tools``, ``response_format``), a turn's kept items
under ``response_items`` as the engine stores them, and the body itself under ``responses``. It
refuses (HTTP 400) what the real API refuses and a test could get wrong: a reasoning item not
followed by the item it preceded (by id), encrypted content that is not what it sent, a function
call output that answers no function call.
"""

import base64
import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from tests.support.scripted.events import (
    Cut,
    Delay,
    ErrorEvent,
    Event,
    Finish,
    HttpError,
    Raw,
    Reasoning,
    Text,
    ToolCall,
    Usage,
)

RESPONSE_ITEMS = "response_items"  # chamvi_runs.core.types.RESPONSE_ITEMS
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def sealed(summary: str) -> str:
    """The ``encrypted_content`` of a scripted reasoning item whose summary is ``summary``."""
    return "gAAAA" + base64.urlsafe_b64encode(summary.encode()).decode()


def _split(value: str, pieces: int) -> list[str]:
    if pieces <= 0 or not value:
        return [value] if value else []
    size = -(-len(value) // pieces)
    return [value[i : i + size] for i in range(0, len(value), size)]


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def responses_payloads(
    events: list[Event], model: str, response_id: str, sleep: Callable[[float], None]
) -> Iterator[tuple[str, str] | str | Cut]:
    """The server-sent events of a streamed reply: ``(event type, data)``, a ``raw`` data line, or a
    final ``Cut``."""
    numbers = itertools.count()
    created = int(time.time())
    output: list[dict[str, Any]] = []
    usage = next((_usage(e.prompt_tokens, e.completion_tokens) for e in events if isinstance(e, Usage)), None)
    current: dict[str, Any] | None = None  # the message or reasoning item being streamed
    pieces: list[str] = []

    def event(kind: str, **fields: Any) -> tuple[str, str]:
        return kind, json.dumps({"type": kind, "sequence_number": next(numbers), **fields})

    def response(status: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "model": model,
            "status": status,
            "output": list(output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "usage": None,
            **fields,
        }

    def opened(kind: str) -> Iterator[tuple[str, str]]:
        nonlocal current
        if current is not None and current["type"] == kind:
            return
        yield from closed()
        index = len(output)
        if kind == "message":
            current = {
                "id": f"msg_{index}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            yield event("response.output_item.added", output_index=index, item=current)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield event(
                "response.content_part.added",
                item_id=current["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        else:
            current = {"id": f"rs_{index}", "type": "reasoning", "summary": []}
            yield event("response.output_item.added", output_index=index, item=current)
            part = {"type": "summary_text", "text": ""}
            yield event(
                "response.reasoning_summary_part.added",
                item_id=current["id"],
                output_index=index,
                summary_index=0,
                part=part,
            )

    def closed() -> Iterator[tuple[str, str]]:
        nonlocal current
        if current is None:
            return
        item, index, whole = current, len(output), "".join(pieces)
        current = None
        pieces.clear()
        if item["type"] == "message":
            part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
            yield event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=whole,
                logprobs=[],
            )
            yield event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
            item = {**item, "status": "completed", "content": [part]}
        else:
            part = {"type": "summary_text", "text": whole}
            yield event(
                "response.reasoning_summary_text.done",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                text=whole,
            )
            yield event(
                "response.reasoning_summary_part.done",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                part=part,
            )
            item = {**item, "summary": [part], "encrypted_content": sealed(whole)}
        output.append(item)
        yield event("response.output_item.done", output_index=index, item=item)

    yield event("response.created", response=response("in_progress"))
    yield event("response.in_progress", response=response("in_progress"))
    for scripted in events:
        match scripted:
            case Delay(seconds):
                sleep(seconds)
            case Text(value):
                yield from opened("message")
                assert current is not None
                pieces.append(value)
                yield event(
                    "response.output_text.delta",
                    item_id=current["id"],
                    output_index=len(output),
                    content_index=0,
                    delta=value,
                    logprobs=[],
                )
            case Reasoning(value):
                yield from opened("reasoning")
                assert current is not None
                pieces.append(value)
                yield event(
                    "response.reasoning_summary_text.delta",
                    item_id=current["id"],
                    output_index=len(output),
                    summary_index=0,
                    delta=value,
                )
            case ToolCall(call_id, name, arguments, _, chunks):
                yield from closed()
                index = len(output)
                item = {
                    "id": f"fc_{index}",
                    "type": "function_call",
                    "call_id": call_id,
                    "name": name,
                    "arguments": "",
                    "status": "in_progress",
                }
                yield event("response.output_item.added", output_index=index, item=item)
                for piece in _split(arguments, chunks):
                    yield event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=piece,
                    )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=arguments,
                )
                item = {**item, "arguments": arguments, "status": "completed"}
                output.append(item)
                yield event("response.output_item.done", output_index=index, item=item)
            case Finish(reason):
                yield from closed()
                if reason in _INCOMPLETE:
                    details = {"reason": _INCOMPLETE[reason]}
                    yield event(
                        "response.incomplete",
                        response=response("incomplete", incomplete_details=details, usage=usage),
                    )
                else:
                    yield event("response.completed", response=response("completed", usage=usage))
            case Usage():
                pass  # carried by the response's last event
            case ErrorEvent(message, error_type, code):
                yield event("error", code=code or error_type, message=message, param=None)
                return
            case Cut():
                yield scripted
                return
            case Raw(payload):
                yield payload
            case HttpError():
                raise AssertionError("http_error is handled before streaming starts")
    yield from closed()


# --- a Responses request, read back as a Chat Completions request --------------------------------


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request ``body`` (a Responses request) stands for; ValueError says what
    the real API would refuse."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("input must be a string or a list of items")
    turn: list[dict[str, Any]] = []  # consecutive output items: one assistant message
    called: set[str] = set()
    for position, item in enumerate(items):
        kind = item.get("type", "message")
        role = item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            if kind == "reasoning":
                _check_reasoning(item, items[position + 1] if position + 1 < len(items) else None)
            if kind == "function_call":
                called.add(item["call_id"])
            turn.append(item)
            continue
        if turn:
            messages.append(_assistant(turn))
            turn = []
        if kind == "function_call_output":
            if item.get("call_id") not in called:
                raise ValueError(
                    f"No tool call found for function call output with call_id {item.get('call_id')}."
                )
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": output if isinstance(output, str) else _chat_parts(output),
                }
            )
        elif kind == "message" and role in ("user", "system", "developer"):
            content = item.get("content")
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": content if isinstance(content, str) else _chat_parts(content),
                }
            )
        else:
            raise ValueError(f"unexpected input item {item!r}")
    if turn:
        messages.append(_assistant(turn))
    view: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "stream": body.get("stream"),
        # A Responses stream always ends with the usage.
        "stream_options": {"include_usage": True},
        "responses": body,
    }
    if body.get("tools"):
        view["tools"] = [_chat_tool(tool) for tool in body["tools"]]
    text_format = (body.get("text") or {}).get("format")
    if text_format and text_format.get("type") == "json_schema":
        view["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in text_format.items() if k != "type"},
        }
    elif text_format:
        view["response_format"] = {"type": text_format["type"]}
    return view


def _check_reasoning(item: dict[str, Any], following: dict[str, Any] | None) -> None:
    summary = item.get("summary")
    if not isinstance(summary, list):
        raise ValueError(f"Input item {item.get('id')!r} missing required field `summary`")
    text = "".join(part.get("text", "") for part in summary)
    if item.get("encrypted_content") != sealed(text):
        raise ValueError(f"The encrypted content for item {item.get('id')} could not be verified.")
    if following is None or following.get("type") == "reasoning" or not following.get("id"):
        raise ValueError(
            f"Item {item.get('id')!r} of type 'reasoning' was provided without its required following item."
        )


def _assistant(turn: list[dict[str, Any]]) -> dict[str, Any]:
    text = []
    calls = []
    kept: list[dict[str, Any]] = []
    for item in turn:
        if item.get("type") == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
            if item.get("id"):
                kept.append({"type": "function_call", "id": item["id"]})
            continue
        if item.get("type", "message") == "message" and "role" in item:
            content = item["content"]
            text.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
        if item.get("id"):
            kept.append(item)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    if any(item.get("type") == "reasoning" for item in kept):
        message[RESPONSE_ITEMS] = kept
    return message


def _chat_parts(parts: Any) -> list[dict[str, Any]]:
    converted = []
    for part in parts or []:
        kind = part.get("type")
        if kind == "input_text":
            converted.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            converted.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "input_file":
            file = {"file_data": part["file_data"]}
            if "filename" in part:
                file["filename"] = part["filename"]
            converted.append({"type": "file", "file": file})
        else:
            raise ValueError(f"unexpected content part {part!r}")
    return converted


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise ValueError(f"unexpected tool {tool!r}")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    if tool.get("strict"):
        function["strict"] = True
    return {"type": "function", "function": function}
