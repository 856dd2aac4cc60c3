"""The ``data:`` payloads of a streamed reply, in the provider's wire format."""

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


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _split(value: str, pieces: int) -> list[str]:
    if pieces <= 0 or not value:
        return []
    size = -(-len(value) // pieces)
    return [value[i : i + size] for i in range(0, len(value), size)]


def sse_payloads(
    events: list[Event], model: str, completion_id: str, sleep: Callable[[float], None]
) -> Iterator[str | Cut]:
    """The ``data:`` payloads of a streamed reply (``[DONE]`` included), or a final ``Cut``."""
    created = int(time.time())
    role_sent = False
    seen_ids: list[str] = []

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        nonlocal role_sent
        if not role_sent:
            delta = {"role": "assistant", **delta}
            role_sent = True
        return json.dumps(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }
        )

    for event in events:
        match event:
            case Delay(seconds):
                sleep(seconds)
            case Text(value):
                yield chunk({"content": value})
            case Reasoning(value):
                yield chunk({"reasoning_content": value})
            case ToolCall(call_id, name, arguments, index, pieces):
                if call_id not in seen_ids:
                    seen_ids.append(call_id)
                if index is None:
                    index = seen_ids.index(call_id)
                first_args = arguments if pieces == 0 else ""
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": first_args},
                            }
                        ]
                    }
                )
                for piece in _split(arguments, pieces):
                    yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            case Finish(reason):
                yield chunk({}, reason)
            case Usage(prompt, completion):
                yield json.dumps(
                    {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage_dict(prompt, completion),
                    }
                )
            case ErrorEvent(message, error_type, code):
                yield json.dumps(
                    {"error": {"message": message, "type": error_type, "code": code, "param": None}}
                )
                return
            case Cut():
                yield event
                return
            case Raw(payload):
                yield payload
            case HttpError():
                raise AssertionError("http_error is handled before streaming starts")
    yield "[DONE]"
