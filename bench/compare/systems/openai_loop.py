"""The tool loop written against the bare ``openai`` client: one streamed model call per turn, the
tool calls assembled from their deltas, the tools run. bare runs it alone; dbos wraps its two
halves (``model_turn``, ``run_tool``) in steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from openai import OpenAI

from bench.compare import workload


def client(base_url: str) -> OpenAI:
    return OpenAI(api_key="bench", base_url=base_url, max_retries=0)


def model_turn(openai: OpenAI, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed call: the assistant message it makes, with its usage."""
    stream = openai.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        tools=workload.TOOL_SCHEMAS,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: dict[str, int] = {}
    for chunk in stream:
        if chunk.usage is not None:
            usage = {"prompt": chunk.usage.prompt_tokens, "completion": chunk.usage.completion_tokens}
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        for part in delta.tool_calls or ():
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            if part.id:
                call["id"] = part.id
            if part.function and part.function.name:
                call["name"] = part.function.name
            if part.function and part.function.arguments:
                call["arguments"] += part.function.arguments
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
    return {"message": message, "usage": usage}


def run_tool(name: str, arguments: str, key: str) -> str:
    """A tool's result as the JSON the model reads; issue_refund gets an idempotency key."""
    kwargs = json.loads(arguments)
    if name == "issue_refund":
        kwargs["key"] = key
    return json.dumps(workload.TOOLS[name](**kwargs))


def tool_loop(
    turn: Callable[[list[dict[str, Any]]], dict[str, Any]],
    tool: Callable[[str, str, str], str],
    run_id: str,
    max_turns: int = 10,
) -> str:
    """Turns until the model answers without a tool call; the answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": workload.INSTRUCTIONS},
        {"role": "user", "content": workload.USER_MESSAGE},
    ]
    for _ in range(max_turns):
        message = turn(messages)["message"]
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return str(message["content"])
        for call in calls:
            result = tool(call["function"]["name"], call["function"]["arguments"], f"{run_id}:{call['id']}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError("the model never answered")
