"""The demo agent: it streams, looks something up, and asks before it refunds."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.conf import settings

from chamvi_runs import Agent, Budget, effect_tool, tool

ORDERS = {
    "A-1001": {"status": "delivered", "total_cents": 4599, "item": "Espresso grinder"},
    "A-1002": {"status": "in transit", "total_cents": 1299, "item": "Milk frother"},
}


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order by id (for example A-1001)."""
    order = ORDERS.get(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return {"order_id": order_id, **order}


@effect_tool
def issue_refund(ctx, order_id: str, amount_cents: int) -> dict:
    """Refund an order. Needs a human's approval."""
    # A real payment API would take ctx.idempotency_key as its idempotency key; here it names the refund.
    refund_id = "rf_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
    return {"refund_id": refund_id, "order_id": order_id, "amount_cents": amount_cents}


support = Agent(
    name="support",
    model=settings.CHAMVI_MODEL,
    instructions="You are a support agent for a coffee gear shop. Look orders up before refunding them.",
    tools=[lookup_order, issue_refund],
    approvals={"issue_refund": True},
    approval_ttl=timedelta(hours=24),
    budget=Budget(max_steps=12),
)
