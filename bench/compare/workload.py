"""The one workload every system runs: a support agent, 4 model turns and 3 tool calls per run.

Pure standard library, so every driver imports it from its own venv. The model's side is
``turn_for(messages)``: what the scripted server answers, chosen from the history so far (the number
of tool results in it), so many runs can share one model name and no reply is scripted per run. The
tools' side is ``TOOLS``: each returns about 1 KB of JSON. ``FINAL_TEXT`` is the answer every run
must end with; drivers check it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ORDER_ID = "A-1001"
AMOUNT_CENTS = 4599
CHUNK = 4  # characters per streamed text chunk
PACED_DELAY = 0.02  # seconds before every chunk when paced
MODELS = {"instant": "bench-instant", "paced": "bench-paced"}
USER_MESSAGE = "Order A-1001 arrived broken. Please check the policy and refund it."
INSTRUCTIONS = (
    "You are a support agent for a coffee gear shop. Look an order up and check the policy before you refund."
)

FINAL_TEXT = (
    "I am sorry the espresso grinder arrived broken. I looked up order A-1001, checked it against "
    "our refund policy (delivered within the last 30 days, damaged on arrival, so it qualifies for "
    "a full refund), and issued a refund of 45.99 EUR to the card you paid with. You will see it "
    "on your statement within 3 to 5 business days. There is no need to send the grinder back. "
    "Is there anything else I can help you with today?"
)


def _padding(prefix: str, count: int) -> list[dict[str, str]]:
    # Filler that makes each tool's result about 1 KB, as a realistic API answer would be.
    return [
        {"at": f"2026-11-{10 + n:02d}T09:{n:02d}:00Z", "note": f"{prefix} event {n} recorded"}
        for n in range(count)
    ]


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by id, for example A-1001."""
    return {
        "order_id": order_id,
        "item": "Espresso grinder",
        "total_cents": AMOUNT_CENTS,
        "currency": "EUR",
        "status": "delivered",
        "customer": {"id": "c-42", "name": "Ada Lovelace", "tier": "gold"},
        "history": _padding("shipping", 13),
    }


def check_refund_policy(order_id: str, reason: str) -> dict[str, Any]:
    """Check whether an order may be refunded, and how much."""
    return {
        "order_id": order_id,
        "reason": reason,
        "eligible": True,
        "max_refund_cents": AMOUNT_CENTS,
        "rules": [f"rule {n}: damaged goods within 30 days are refunded in full" for n in range(10)],
        "checked": _padding("policy", 3),
    }


def issue_refund(order_id: str, amount_cents: int, key: str = "") -> dict[str, Any]:
    """Refund part or all of an order."""
    return {
        "refund_id": f"rf-{key[-12:]}",
        "idempotency_key": key,
        "order_id": order_id,
        "amount_cents": amount_cents,
        "status": "issued",
        "ledger": _padding("ledger", 12),
    }


TOOLS: dict[str, Callable[..., dict[str, Any]]] = {
    "lookup_order": lookup_order,
    "check_refund_policy": check_refund_policy,
    "issue_refund": issue_refund,
}

# JSON schemas of the tools' parameters, for the drivers that hand the model raw schemas.
TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": lookup_order.__doc__,
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_refund_policy",
            "description": check_refund_policy.__doc__,
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["order_id", "reason"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": issue_refund.__doc__,
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
                "required": ["order_id", "amount_cents"],
            },
        },
    },
]


@dataclass(frozen=True)
class Turn:
    """One model turn: streamed text, then at most one tool call, then usage."""

    text: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 28


TURNS: list[Turn] = [
    Turn("Let me look that order up.", "lookup_order", {"order_id": ORDER_ID}, 180, 24),
    Turn(
        "Found it. Checking the policy.",
        "check_refund_policy",
        {"order_id": ORDER_ID, "reason": "damaged"},
        520,
    ),
    Turn(
        "It qualifies. Refunding now.",
        "issue_refund",
        {"order_id": ORDER_ID, "amount_cents": AMOUNT_CENTS},
        860,
    ),
    Turn(FINAL_TEXT, None, None, 1200, 96),
]


def turn_for(messages: list[dict[str, Any]]) -> Turn:
    """The turn a model answers ``messages`` with: one per tool result already in the history."""
    done = sum(1 for message in messages if message.get("role") == "tool")
    return TURNS[min(done, len(TURNS) - 1)]


def chunks(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)]


def transcript(run_id: str) -> list[list[dict[str, Any]]]:
    """The message history after each model step of one run, as a tool loop builds it: for rawsql,
    which writes what the others write without calling a model."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": USER_MESSAGE},
    ]
    after_each: list[list[dict[str, Any]]] = []
    for number, turn in enumerate(TURNS):
        if turn.tool is None:
            messages.append({"role": "assistant", "content": turn.text})
        else:
            call_id = f"call_{run_id[:8]}_{number}"
            messages.append(
                {
                    "role": "assistant",
                    "content": turn.text,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": turn.tool, "arguments": json.dumps(turn.arguments)},
                        }
                    ],
                }
            )
            arguments = dict(turn.arguments or {})
            if turn.tool == "issue_refund":
                arguments["key"] = f"{run_id}:{call_id}"
            result = TOOLS[turn.tool](**arguments)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
        after_each.append(list(messages))
    return after_each
