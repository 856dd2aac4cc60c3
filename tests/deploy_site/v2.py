"""The new release of the deploy site's agents (``CHAMVI_TEST_DEPLOY=v2``): the desk's refund needs
a reason, the archivist can no longer archive, and the custom agent decides itself which of its old
runs go on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from chamvi_runs import Agent, effect_tool, tool

from . import effect_ran, record

if TYPE_CHECKING:
    from chamvi_runs.agents.versions import VersionChange

RELEASE = "v2"


@tool
def lookup(order: int) -> dict:
    """Look an order up."""
    return {"order": order, "total": 40}


@effect_tool
def refund(ctx, order: int, amount: int, reason: str) -> dict:
    """Refund part or all of an order, saying why."""
    effect_ran(RELEASE, "refund", ctx, {"order": order, "amount": amount, "reason": reason})
    return {"refunded": amount, "order": order, "reason": reason}


desk = Agent(
    name="deploy-desk",
    model="m-deploy-desk",
    instructions="You are the refund desk (v2). Look an order up, and give a reason with every refund.",
    tools=[lookup, refund],
    approvals={"refund": True},
)


@tool
def confirm() -> str:
    """Close the request, once a person agreed."""
    return "confirmed"


# archive is gone: a run whose history called it cannot go on (the default rule fails it).
archivist = Agent(
    name="deploy-archive",
    model="m-deploy-archive",
    instructions="You are the archivist (v2).",
    tools=[confirm],
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


def keep_when_asked(change: VersionChange) -> Literal["continue", "fail"]:
    """Only the old runs whose payload says "keep" go on; the default rule would keep them all (no
    tool is gone)."""
    record(
        "CHAMVI_TEST_DEPLOY_RULES",
        {"run": change.run.pk, "old": change.old, "new": change.new, "called": sorted(change.called)},
    )
    return "continue" if "keep" in str(change.run.trigger.get("payload")) else "fail"


custom = Agent(
    name="deploy-custom",
    model="m-deploy-custom",
    instructions="You are the custom agent (v2).",
    tools=[ping, proceed],
    approvals={"proceed": True},
    on_version_change=keep_when_asked,
)
