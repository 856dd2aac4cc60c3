"""The old release of the deploy site's agents (``CHAMVI_TEST_DEPLOY=v1``, the default)."""

from __future__ import annotations

from chamvi_runs import Agent, effect_tool, tool

from . import effect_ran

RELEASE = "v1"


@tool
def lookup(order: int) -> dict:
    """Look an order up."""
    return {"order": order, "total": 40}


@effect_tool
def refund(ctx, order: int, amount: int) -> dict:
    """Refund part or all of an order."""
    effect_ran(RELEASE, "refund", ctx, {"order": order, "amount": amount})
    return {"refunded": amount, "order": order}


desk = Agent(
    name="deploy-desk",
    model="m-deploy-desk",
    instructions="You are the refund desk (v1). Look an order up before you refund it.",
    tools=[lookup, refund],
    approvals={"refund": True},
)


@effect_tool
def archive(ctx, item: int) -> dict:
    """Archive an item."""
    effect_ran(RELEASE, "archive", ctx, {"item": item})
    return {"archived": item}


@tool
def confirm() -> str:
    """Close the request, once a person agreed."""
    return "confirmed"


archivist = Agent(
    name="deploy-archive",
    model="m-deploy-archive",
    instructions="You are the archivist (v1).",
    tools=[archive, confirm],
    approvals={"confirm": True},
)


@tool
def ping() -> str:
    """Check the line."""
    return "pong"


@tool
def proceed() -> str:
    """Go on, once a person agreed."""
    return "proceeding"


custom = Agent(
    name="deploy-custom",
    model="m-deploy-custom",
    instructions="You are the custom agent (v1).",
    tools=[ping, proceed],
    approvals={"proceed": True},
)
