"""The offline demo model, used when no OPENAI_API_KEY is set: it plays a support conversation
(streamed text, a lookup, a refund that needs approval, a final answer) without any network."""

from __future__ import annotations

import json
import re

from chamvi_runs.testing import ScriptedModel, ScriptedTurn


def _order_id(text: str) -> str:
    match = re.search(r"[A-Z]-\d{4}", text)
    return match.group(0) if match else "A-1001"


def _is_trigger(message: dict) -> bool:
    """The first message of a run: a user message holding the JSON block of its trigger."""
    content = message.get("content")
    text = content if isinstance(content, str) else (content or [{}])[0].get("text", "")
    try:
        block = json.loads(text)
        return message.get("role") == "user" and isinstance(block, dict) and "payload" in block
    except (TypeError, ValueError, AttributeError):
        return False


def _next_turn(messages: list[dict]) -> ScriptedTurn:
    # A run of a thread starts after the thread's earlier runs: only its own part of the history counts.
    start = max((n for n, m in enumerate(messages) if _is_trigger(m)), default=0)
    own = messages[start:]
    tool_results = [m for m in own if m.get("role") == "tool"]
    content = own[0].get("content") if own else ""
    text = content if isinstance(content, str) else json.dumps(content)
    order = _order_id(text)
    if not tool_results:
        return ScriptedTurn(
            reasoning="The customer mentions an order; look it up first.",
            text=f"Let me look up order {order} for you.",
            tool_calls=[("lookup_order", {"order_id": order})],
        )
    if len(tool_results) == 1:
        return ScriptedTurn(
            text="I found it. I'll request a refund, which a colleague has to approve.",
            tool_calls=[("issue_refund", {"order_id": order, "amount_cents": 1000})],
        )
    last = tool_results[-1]["content"]
    if "not run" in last:
        return ScriptedTurn(text=f"The refund for {order} was not approved, so I did not issue it. {last}")
    return ScriptedTurn(text=f"Done: the refund for {order} is issued ({last}). Anything else?")


class OfflineDemoModel(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(_next_turn, chunk_delay=0.04)
