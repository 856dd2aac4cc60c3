"""The offline demo model, used when no OPENAI_API_KEY is set: it plays a support conversation
(streamed text, a lookup, a refund that needs approval, a final answer) without any network."""

from __future__ import annotations

import json
import re

from chamvi_runs.testing import ScriptedModel, ScriptedTurn


def _order_id(text: str) -> str:
    match = re.search(r"[A-Z]-\d{4}", text)
    return match.group(0) if match else "A-1001"


def _next_turn(messages: list[dict]) -> ScriptedTurn:
    tool_results = [m for m in messages if m.get("role") == "tool"]
    first = messages[1] if messages and messages[0].get("role") == "system" else messages[0]
    content = first.get("content")
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
