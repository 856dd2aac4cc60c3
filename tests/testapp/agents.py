"""Agents of the test suite. Each uses its own model name, which selects its script in the scripted
server, so tests stay independent. Worker subprocesses import these too."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Literal

import pydantic

from chamvi_runs import Agent, Approval, Budget, effect_tool, human_tool, tool
from chamvi_runs.mcp import mcp_tools

from .models import Refund


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(f"exploded: {reason}")


@tool
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "slept"


@tool
def whoami(ctx) -> dict:
    """The run's trigger keys."""
    return {"keys": ctx.run.trigger["keys"], "thread": ctx.run.trigger["thread"]}


@effect_tool
def refund(ctx, order_id: str, amount_cents: int) -> dict:
    """Refund an order (writes a Refund row)."""
    Refund.objects.create(order_id=order_id, amount_cents=amount_cents, idempotency_key=ctx.idempotency_key)
    sink = os.environ.get("CHAMVI_EFFECT_SINK")
    if sink:
        with open(sink, "a") as handle:
            handle.write(ctx.idempotency_key + "\n")
    return {"refunded": amount_cents, "key": ctx.idempotency_key}


class Verdict(pydantic.BaseModel):
    label: str
    score: float


def _agent(name: str, **kwargs) -> Agent:
    return Agent(name=name, model=f"m-{name}", instructions=f"You are {name}.", **kwargs)


@tool
def crash_worker(code: int) -> str:
    """Kill the process at once, as a segfault or the OOM killer would."""
    os._exit(code)


TOOLS = [add, explode, slow, whoami, refund]

basic = _agent("basic", tools=TOOLS)
structured = _agent("structured", output=Verdict)
schema_dict = _agent(
    "schema_dict",
    output={"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
limited = _agent("limited", tools=TOOLS, budget=Budget(max_steps=2))
token_limited = _agent("token_limited", tools=TOOLS, budget=Budget(max_tokens=50))
timed = _agent("timed", tools=TOOLS, budget=Budget(timeout_ms=1500))
approving = _agent("approving", tools=TOOLS, approvals={"refund": True}, approval_ttl=timedelta(minutes=5))
expiring_fail = _agent("expiring_fail", tools=TOOLS, approvals={"refund": True}, on_approval_expired="fail")
conditional = _agent(
    "conditional", tools=TOOLS, approvals={"refund": lambda args, ctx: args["amount_cents"] > 1000}
)
factory = Agent(
    name="factory",
    model="m-factory",
    instructions=lambda ctx: f"Run {ctx.run.pk} for {ctx.run.trigger['payload']}",
    tools=lambda ctx: [add] if ctx.run.trigger["keys"].get("math") else [whoami],
)
faulty = _agent("faulty", tools=[add, refund])


class Shipping(pydantic.BaseModel):
    speed: Literal["standard", "express"]
    gift: bool = False


ask_user = human_tool("ask_user", "Ask the user a question.", answer_schema=str)
confirm = human_tool("confirm", "Ask the user to confirm, yes or no.", answer_schema=bool)
choose_shipping = human_tool("choose_shipping", "Ask how to ship.", answer_schema=Shipping, ttl=600)
browser_locale = human_tool("browser_locale", "The user's locale, from their browser.", client=True)
QUESTIONS = [ask_user, confirm, choose_shipping, browser_locale]

# Questions (SPEC §12): the model asks its user; refunds still need approval, and may be edited.
asking = _agent("asking", tools=[*QUESTIONS, *TOOLS], approvals={"refund": True})
asking_two = _agent("asking_two", tools=[*QUESTIONS, *TOOLS], approvals={"refund": True})
confirming = _agent("confirming", tools=[confirm, add])
editing_locked = _agent("editing_locked", tools=TOOLS, approvals={"refund": Approval(editable=False)})
poison = _agent("poison", tools=[crash_worker, add])
poison_limited = _agent("poison_limited", tools=[crash_worker, add], budget=Budget(max_steps=2))


@tool
def probe_locks(ctx) -> dict:
    """Report whether this tool runs inside a transaction, and whether another connection can lock
    the run's row right now (NOWAIT), i.e. whether the engine holds a lock during tool calls."""
    import threading

    from django.db import DatabaseError, connection, transaction

    from chamvi_runs.models import Run

    result = {"in_transaction": connection.in_atomic_block}

    def other_connection() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update(nowait=True).filter(pk=ctx.run.pk).exists()
            result["row_free"] = True
        except DatabaseError:
            result["row_free"] = False
        finally:
            connection.close()

    thread = threading.Thread(target=other_connection)
    thread.start()
    thread.join(10)
    return result


probing = _agent("probing", tools=[probe_locks])


def _wait_at_gate(ctx) -> None:
    """Stay inside the tool until the test opens the gate: ``$CHAMVI_TEST_GATE/open`` exists. The
    files ``<run id>.inside`` and ``<run id>.aborted`` there tell the test that the tool is in, and
    that the execution was told to stop (a cancel) while it was."""
    from pathlib import Path

    gate = Path(os.environ["CHAMVI_TEST_GATE"])
    (gate / f"{ctx.run.pk}.inside").touch()
    deadline = time.monotonic() + 50
    while not (gate / "open").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        if ctx.abort.is_set():
            (gate / f"{ctx.run.pk}.aborted").touch()
        time.sleep(0.02)


@effect_tool
def gated_refund(ctx, order_id: str, amount_cents: int) -> dict:
    """Refund an order (a Refund row) once the test opens the gate."""
    _wait_at_gate(ctx)
    Refund.objects.create(order_id=order_id, amount_cents=amount_cents, idempotency_key=ctx.idempotency_key)
    return {"refunded": amount_cents}


@tool
def gated_wait(ctx) -> str:
    """Return once the test opens the gate."""
    _wait_at_gate(ctx)
    return "opened"


gated_effects = _agent("gated_effects", tools=[gated_refund])
gated = _agent("gated", tools=[gated_wait])


# Delegation (SPEC §13): a triage agent hands tasks to billing (whose refunds need approval), to a
# researcher that declares its own input, and to a judge whose structured output may not fit; a
# chain of three for the depth cap.
class Topic(pydantic.BaseModel):
    topic: str
    sources: int = 1


billing = _agent("billing", tools=TOOLS, approvals={"refund": True})
researcher = _agent("researcher", tools=[add], input=Topic)
triage = _agent(
    "triage",
    tools=[
        billing,
        researcher.as_tool(name="research", description="Research a topic."),
        structured.as_tool(name="judge"),
        add,
    ],
)
triage_limited = _agent("triage_limited", tools=[billing], budget=Budget(max_tokens=50))
chain_c = _agent("chain_c", tools=[add])
chain_b = _agent("chain_b", tools=[chain_c])
chain_a = _agent("chain_a", tools=[chain_b])


# A rolling deploy (tests/system/test_rolling_deploy.py): the release of the deploy site's agents this
# process has, old ("v1", the default) or new ("v2").
# MCP (SPEC §15): the test MCP server over stdio, a child of each process that calls its tools.
mcp_desk = _agent(
    "mcp_desk",
    tools=[
        mcp_tools(
            "crm",
            command=[sys.executable, "-m", "tests.support.mcp_server"],
            cwd=str(Path(__file__).resolve().parents[2]),
            prefix="crm_",
            effects=["create_ticket"],
            # What tests/system/test_mcp_worker.py gives each worker, passed on to its server.
            env={
                name: os.environ.get(name, "")
                for name in ("CHAMVI_TEST_MCP_LOG", "CHAMVI_TEST_MCP_KILL_CALLER")
            },
        )
    ],
)

from importlib import import_module  # noqa: E402

_DEPLOY = os.environ.get("CHAMVI_TEST_DEPLOY", "v1")
if _DEPLOY not in ("v1", "v2"):
    raise RuntimeError(f"CHAMVI_TEST_DEPLOY must be 'v1' or 'v2', not {_DEPLOY!r}")
import_module(f"tests.deploy_site.{_DEPLOY}")
