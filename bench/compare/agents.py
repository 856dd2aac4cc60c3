"""The bench's support agent, through chamvi_runs' public API only: one agent per pacing, each
naming the scripted model that paces its stream (workload_model.py)."""

from __future__ import annotations

from typing import Any

from bench.compare import workload
from chamvi_runs import Agent, Budget, effect_tool, tool


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order by id, for example A-1001."""
    return workload.lookup_order(order_id)


@tool
def check_refund_policy(order_id: str, reason: str) -> dict:
    """Check whether an order may be refunded, and how much."""
    return workload.check_refund_policy(order_id, reason)


@effect_tool
def issue_refund(ctx: Any, order_id: str, amount_cents: int) -> dict:
    """Refund part or all of an order."""
    return workload.issue_refund(order_id, amount_cents, key=ctx.idempotency_key)


AGENTS = {
    pacing: Agent(
        name=f"bench_{pacing}",
        model=model,
        instructions=workload.INSTRUCTIONS,
        tools=[lookup_order, check_refund_policy, issue_refund],
        budget=Budget(max_steps=10),
    )
    for pacing, model in workload.MODELS.items()
}
