"""The engine's decision paths (``runtime.engine``), each run end to end against the in-memory store
(``chamvi_runs.testing_store``) and the in-process ScriptedModel: no PostgreSQL, Redis or model
server. Each test asserts what a user sees: the run's status, output and error, the steps recorded,
what the model was told, and that a worker that lost its run wrote nothing.

What an execution reaches outside the store port is replaced here, as a site's own tests would:
the broadcaster (events are recorded), the settle's announcement (``announce_settled`` reads the
Django store and rings the doorbell) and the notifier of a wait (``notify`` writes through it)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.dispatch import Signal

from chamvi_runs import Budget, tool
from chamvi_runs.agents.agent import Agent, registry
from chamvi_runs.agents.tools import Tool
from chamvi_runs.conf import conf
from chamvi_runs.core.decisions import CLOSED_BY, INCOMPLETE
from chamvi_runs.core.messages import tool_result
from chamvi_runs.core.records import StepRecord, Stored
from chamvi_runs.core.states import ErrorCode, Status
from chamvi_runs.core.types import AbortSignal, Message, ModelRequest, ModelTurn, OnDelta, Usage
from chamvi_runs.errors import DecisionRefused, LeaseLostError
from chamvi_runs.models import WaitPoint
from chamvi_runs.runtime import engine, fenced_writes, model_step
from chamvi_runs.runtime.engine import Execution
from chamvi_runs.signals import execution_error
from chamvi_runs.testing import ScriptedModel, ScriptedTurn
from chamvi_runs.testing_store import InMemoryStore

pytestmark = pytest.mark.timeout(10)

LEASE = conf.LEASE_SECONDS
_names = itertools.count()

Turn = ScriptedTurn | Callable[[list[Message]], ScriptedTurn]


class Recorder:
    """A broadcaster that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        self.events.append({**event, "run_id": run_id})

    def flush(self) -> None:
        pass

    def types(self) -> list[str]:
        return [e["type"] for e in self.events if e["type"] != "delta"]


class Script:
    """The model's turns, in order: a ScriptedTurn, or a function of the request's messages that
    returns one after acting as the world would while the model answers."""

    def __init__(self) -> None:
        self.turns: deque[Turn] = deque()
        self.requests: list[list[Message]] = []

    def __call__(self, messages: list[Message]) -> ScriptedTurn:
        self.requests.append(messages)
        assert self.turns, "the model was called once more than scripted"
        turn = self.turns.popleft()
        return turn(messages) if callable(turn) else turn


@dataclass
class Harness:
    store: InMemoryStore
    script: Script
    broadcaster: Recorder
    settled: list[str] = field(default_factory=list)
    notified: list[WaitPoint] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)

    def agent(self, **kwargs: Any) -> Agent:
        agent = Agent(name=f"decisions-{next(_names)}", model="m-decisions", **kwargs)
        self.agents.append(agent.name)
        return agent

    def model_answers(self, *turns: Turn) -> None:
        self.script.turns.extend(turns)

    def execute(
        self, run_id: str, owner: str = "worker-1", shutdown: AbortSignal | None = None
    ) -> str | None:
        """What ``engine.execute`` does, with this store: claim, then run the execution."""
        claim = self.store.claim(run_id, owner, LEASE)
        assert claim is not None, f"{owner} could not claim {run_id}"
        return Execution(claim, shutdown, db=self.store).run()

    def steps(self, run_id: str) -> list[tuple[int, str, str]]:
        return [(s.index, s.kind, s.name) for s in self.store.steps(run_id)]


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    script = Script()
    model = ScriptedModel(script)
    h = Harness(InMemoryStore(), script, Recorder())
    monkeypatch.setattr(model_step, "model", lambda agent: model)
    monkeypatch.setattr(
        engine, "ChannelsBroadcaster", lambda thread=None, scope="", ancestors=(): h.broadcaster
    )
    monkeypatch.setattr(
        fenced_writes,
        "announce_settled",
        lambda run_id, broadcaster=None, waited=True, run=None: h.settled.append(run_id),
    )
    monkeypatch.setattr(
        fenced_writes, "notify", lambda agent, run, waitpoint, **_: h.notified.append(waitpoint)
    )
    yield h
    for name in h.agents:
        registry.unregister(name)
    assert not script.turns, f"scripted turns were never asked for: {list(script.turns)}"


@contextmanager
def _receiving(signal: Signal, receiver: Callable[..., None]) -> Iterator[None]:
    signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(f"exploded: {reason}")


def refund_tool(ran: list[tuple[str, int]]) -> Tool:
    """A refund tool that records what it refunded in ``ran``."""

    @tool
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append((order, amount))
        return f"refunded {amount}"

    return refund


def calls(*pairs: tuple[str, dict[str, Any]]) -> ScriptedTurn:
    return ScriptedTurn(tool_calls=list(pairs))


def answer(text: str) -> ScriptedTurn:
    return ScriptedTurn(text=text)


# --- a run to its end ---------------------------------------------------------------------------


def test_a_run_calls_its_tools_and_completes_with_the_models_answer(harness):
    agent = harness.agent(tools=[add])
    run = harness.store.start_run(agent.name, "What is 2 + 3?")
    harness.model_answers(calls(("add", {"a": 2, "b": 3})), answer("It is 5."))

    assert harness.execute(run.pk) == Status.COMPLETED
    done = harness.store.run(run.pk)
    assert (done.status, done.output, done.error) == ("completed", "It is 5.", None)
    assert done.model_calls == 2 and done.input_tokens > 0 and done.output_tokens > 0
    assert done.claim_owner is None and done.finished_at is not None
    assert harness.steps(run.pk) == [(0, "llm", "m-decisions"), (1, "tool", "add"), (2, "llm", "m-decisions")]
    assert harness.store.steps(run.pk)[1].output == 5
    call_id = harness.store.steps(run.pk)[0].output["tool_calls"][0]["id"]
    assert harness.script.requests[1][-1] == tool_result(call_id, "5")
    history, index = harness.store.checkpoint(run.pk)
    assert index == 2 and history[-1] == {"role": "assistant", "content": "It is 5."}
    assert harness.settled == [run.pk]
    assert harness.broadcaster.types() == [
        "run.start", "step.start", "step.end", "tool.call", "tool.result", "step.start", "step.end",
    ]  # fmt: skip


def test_a_tool_that_raises_gives_the_model_its_error_and_the_run_goes_on(harness):
    agent = harness.agent(tools=[explode])
    run = harness.store.start_run(agent.name, "try it")
    harness.model_answers(calls(("explode", {"reason": "disk full"})), answer("The tool failed: disk full."))

    assert harness.execute(run.pk) == Status.COMPLETED
    failed_call = harness.store.steps(run.pk)[1]
    assert (failed_call.kind, failed_call.error) == ("tool", "RuntimeError: exploded: disk full")
    assert harness.script.requests[1][-1]["content"] == "Error: RuntimeError: exploded: disk full"
    assert harness.store.run(run.pk).output == "The tool failed: disk full."


def test_input_sent_while_the_model_answers_gets_another_model_call(harness):
    agent = harness.agent()
    run = harness.store.start_run(agent.name, "Say hello")

    def hello_while_input_arrives(messages: list[Message]) -> ScriptedTurn:
        harness.store.add_input(run.pk, "In French, please.")
        return answer("Hello")

    harness.model_answers(hello_while_input_arrives, answer("Bonjour"))

    assert harness.execute(run.pk) == Status.COMPLETED
    assert harness.store.run(run.pk).output == "Bonjour"
    assert harness.steps(run.pk) == [(0, "llm", "m-decisions"), (1, "llm", "m-decisions")]
    assert harness.script.requests[1][-2:] == [
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "In French, please."},
    ]
    assert [i.consumed_step for i in harness.store.inputs(run.pk)] == [1]


# --- a claim that lost its run ------------------------------------------------------------------


def test_a_worker_whose_run_another_worker_claimed_writes_nothing_and_runs_no_tool(harness):
    ran: list[tuple[str, int]] = []
    agent = harness.agent(tools=[refund_tool(ran)])
    run = harness.store.start_run(agent.name, "refund A1")
    taken = []

    def frozen_past_the_lease(messages: list[Message]) -> ScriptedTurn:
        # worker-1 stalls during the stream; its lease runs out and worker-2 claims the run.
        harness.store.advance(LEASE + 1)
        taken.append(harness.store.claim(run.pk, "worker-2", LEASE))
        return calls(("refund", {"order": "A1", "amount": 30}))

    harness.model_answers(frozen_past_the_lease)
    errors: list[BaseException] = []
    with _receiving(execution_error, lambda error, **_: errors.append(error)):
        assert harness.execute(run.pk, owner="worker-1") is None
    assert ran == [] and harness.store.steps(run.pk) == [] and harness.store.checkpoint(run.pk) is None
    # Reported as the claim's loss, at the write that found it.
    assert [(type(e), str(e)) for e in errors] == [
        (LeaseLostError, f"run {run.pk}: lease lost before running tools")
    ]
    held = harness.store.run(run.pk)
    assert (held.status, held.claim_owner, held.attempt) == ("running", "worker-2", 2)
    assert (held.input_tokens, held.output_tokens) == (0, 0)

    harness.model_answers(calls(("refund", {"order": "A1", "amount": 30})), answer("Refunded."))
    assert Execution(taken[0], None, db=harness.store).run() == Status.COMPLETED
    assert ran == [("A1", 30)]
    assert {s.attempt for s in harness.store.steps(run.pk)} == {2}
    # The stale worker's model call was counted before it was made: it used the budget.
    assert harness.store.run(run.pk).model_calls == 3


# The attempt fences too: a worker that restarted under the same name claims with a new one.
@pytest.mark.parametrize("next_owner", ["worker-2", "worker-1"])
def test_every_write_of_a_claim_another_execution_took_over_is_refused(harness, next_owner):
    run = harness.store.start_run("decisions-any", "x")
    stale = harness.store.claim(run.pk, "worker-1", LEASE)
    assert stale is not None and harness.store.claim(run.pk, next_owner, LEASE) is None  # a live lease
    harness.store.advance(LEASE + 0.001)
    fresh = harness.store.claim(run.pk, next_owner, LEASE)
    assert fresh is not None and fresh.attempt == stale.attempt + 1 and fresh.resumed

    step = [StepRecord(index=0, kind="llm", output={"finish_reason": "stop"})]
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "done"}]
    usage = Usage(5, 5)
    assert harness.store.renew(stale, LEASE, usage=usage) is False
    assert harness.store.renew_many([stale, fresh], LEASE) == {run.pk}
    assert harness.store.start_model_call(stale) is None
    assert harness.store.save_step(stale, step, history, usage=usage) is False
    assert harness.store.save_step_and_count(stale, step, history, usage=usage) is None
    ending = {"finish_reason": "stop", "usage": usage, "consumed_inputs": (), "status": Status.COMPLETED}
    assert harness.store.save_and_settle(stale, step, history, **ending) is None
    assert harness.store.open_wait(stale, step, history, waits=[]) is None
    assert harness.store.back_to_waiting(stale) is False
    assert harness.store.settle(stale, Status.FAILED) is False
    after = harness.store.run(run.pk)
    assert (after.status, after.claim_owner, after.model_calls, after.input_tokens) == (
        "running",
        next_owner,
        0,
        0,
    )
    assert harness.store.steps(run.pk) == []

    settled = harness.store.save_and_settle(fresh, step, history, **ending)
    assert settled.status == harness.store.run(run.pk).status == "completed"


def test_a_lease_that_ran_out_still_lets_its_worker_write_until_another_claims(harness):
    # The fence is the claim (owner and attempt), not the clock, as on PostgreSQL.
    run = harness.store.start_run("decisions-any", "x")
    claim = harness.store.claim(run.pk, "worker-1", LEASE)
    assert claim is not None
    harness.store.advance(LEASE * 10)
    step = [StepRecord(index=0, kind="llm")]
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert harness.store.save_step(claim, step, history, stored=Stored(0, whole=True, opening_length=0))
    # The same step index is recorded once: a second write of it is refused whole.
    assert harness.store.save_step(claim, step, history, usage=Usage(7, 7)) is False
    assert harness.store.run(run.pk).input_tokens == 0
    assert harness.store.claim(run.pk, "worker-2", LEASE) is not None
    assert harness.store.checkpoint(run.pk) == (history, 0)
    assert harness.store.history(run.pk, -1) == ([], -1)  # the trigger message came with step 0


def test_a_run_waits_for_the_elder_of_its_concurrency_key_to_settle(harness):
    agent = harness.agent()
    first = harness.store.start_run(agent.name, "one", concurrency_key="account-7")
    second = harness.store.start_run(agent.name, "two", concurrency_key="account-7")
    other = harness.store.start_run(agent.name, "three", concurrency_key="account-8")
    assert harness.store.claim(second.pk, "worker-2", LEASE) is None  # its elder is queued
    assert harness.store.claim(other.pk, "worker-3", LEASE) is not None

    harness.model_answers(answer("first"), answer("second"))
    assert harness.execute(first.pk) == Status.COMPLETED
    assert harness.execute(second.pk, owner="worker-2") == Status.COMPLETED


def test_a_run_whose_executions_keep_dying_before_writing_fails(harness):
    agent = harness.agent()
    run = harness.store.start_run(agent.name, "x")
    for n in range(conf.MAX_ATTEMPTS):
        # Each worker claims, then dies before it writes anything (a tool that kills it).
        assert harness.store.claim(run.pk, f"dead-{n}", LEASE) is not None
        harness.store.advance(LEASE + 1)

    assert harness.execute(run.pk) == Status.FAILED
    assert harness.store.run(run.pk).error_code == ErrorCode.TOO_MANY_ATTEMPTS


# --- cancel and drain ---------------------------------------------------------------------------


def test_a_cancel_requested_while_a_tool_runs_stops_the_run_before_the_next_model_call(harness):
    @tool
    def lookup(ctx, order: str) -> str:
        """Look an order up."""
        # The user cancels; a worker holds the run, so the cancel is requested, and its lease
        # keeper aborts the execution at its next poll.
        assert harness.store.cancel(ctx.run.pk) is False
        assert ctx.abort.wait(5)
        return "shipped"

    agent = harness.agent(tools=[lookup])
    run = harness.store.start_run(agent.name, "where is A1?")
    harness.model_answers(calls(("lookup", {"order": "A1"})))

    assert harness.execute(run.pk) == Status.CANCELLED
    done = harness.store.run(run.pk)
    assert (done.status, done.cancel_requested, done.model_calls) == ("cancelled", True, 1)
    # What the tool did is kept.
    assert harness.steps(run.pk) == [(0, "llm", "m-decisions"), (1, "tool", "lookup")]
    assert harness.store.steps(run.pk)[1].output == "shipped"


def test_a_cancel_requested_while_the_model_answers_wins_over_the_approval_it_asks_for(harness):
    ran: list[tuple[str, int]] = []
    agent = harness.agent(tools=[refund_tool(ran)], approvals={"refund": True})
    run = harness.store.start_run(agent.name, "refund A1")

    def cancelled_meanwhile(messages: list[Message]) -> ScriptedTurn:
        assert harness.store.cancel(run.pk) is False  # worker-1 holds the run: the cancel is requested
        return calls(("refund", {"order": "A1", "amount": 30}))

    harness.model_answers(cancelled_meanwhile)

    assert harness.execute(run.pk) == Status.CANCELLED
    assert harness.store.run(run.pk).status == "cancelled"
    assert harness.store.waitpoints(run.pk) == [] and harness.notified == [] and ran == []
    assert harness.steps(run.pk) == [(0, "llm", "m-decisions")]
    history, _ = harness.store.checkpoint(run.pk)
    call_id = history[-2]["tool_calls"][0]["id"]
    assert history[-1] == tool_result(call_id, CLOSED_BY["cancel"])


def test_a_drained_worker_leaves_the_run_interrupted_and_the_next_one_finishes_it(harness):
    agent = harness.agent()
    run = harness.store.start_run(agent.name, "hi")
    shutdown = AbortSignal()

    def drained_meanwhile(messages: list[Message]) -> ScriptedTurn:
        shutdown.set("drain")  # the worker process is asked to stop while the model answers
        return answer("never saved")

    harness.model_answers(drained_meanwhile)
    assert harness.execute(run.pk, shutdown=shutdown) == Status.INTERRUPTED
    assert harness.store.run(run.pk).status == "interrupted" and harness.store.steps(run.pk) == []

    harness.model_answers(answer("Hello."))
    assert harness.execute(run.pk, owner="worker-2") == Status.COMPLETED
    done = harness.store.run(run.pk)
    assert (done.output, done.model_calls, done.attempt) == ("Hello.", 2, 2)
    assert "run.resume" in harness.broadcaster.types()


# --- waiting for a person -----------------------------------------------------------------------


def _wait_for_refund_approval(harness: Harness, ran: list[tuple[str, int]], **agent_options: Any) -> str:
    agent = harness.agent(tools=[refund_tool(ran)], approvals={"refund": True}, **agent_options)
    run = harness.store.start_run(agent.name, "refund A1")
    harness.model_answers(calls(("refund", {"order": "A1", "amount": 30})))
    assert harness.execute(run.pk) == Status.WAITING
    return run.pk


def test_an_approval_waits_then_the_approved_call_runs_and_the_run_completes(harness):
    ran: list[tuple[str, int]] = []
    run_id = _wait_for_refund_approval(harness, ran)
    waiting = harness.store.run(run_id)
    assert (waiting.status, waiting.claim_owner, ran) == ("waiting", None, [])
    assert harness.steps(run_id) == [(0, "llm", "m-decisions"), (1, "wait", "refund")]
    (waitpoint,) = harness.store.waitpoints(run_id)
    assert (waitpoint.kind, waitpoint.input, waitpoint.decision) == (
        "approval",
        {"order": "A1", "amount": 30},
        None,
    )
    assert [w.approval_id for w in harness.notified] == [waitpoint.approval_id]
    assert "run.waiting" in harness.broadcaster.types()

    decided = harness.store.decide(waitpoint.approval_id, "approved", token=harness.notified[0].token)
    assert decided.resumes and harness.store.run(run_id).status == "running"
    harness.model_answers(answer("Refunded 30."))
    assert harness.execute(run_id, owner="worker-2") == Status.COMPLETED

    assert ran == [("A1", 30)]
    assert harness.store.run(run_id).output == "Refunded 30."
    assert harness.steps(run_id) == [
        (0, "llm", "m-decisions"), (1, "wait", "refund"), (2, "tool", "refund"), (3, "llm", "m-decisions"),
    ]  # fmt: skip
    resume = next(e for e in harness.broadcaster.events if e["type"] == "run.resume")
    assert resume["decision"]["decision"] == "approved"
    with pytest.raises(DecisionRefused) as refused:
        harness.store.decide(waitpoint.approval_id, "denied")
    assert refused.value.code == "already_decided"


def test_a_denied_call_never_runs_and_the_model_is_told_why(harness):
    ran: list[tuple[str, int]] = []
    run_id = _wait_for_refund_approval(harness, ran)
    (waitpoint,) = harness.store.waitpoints(run_id)

    assert harness.store.decide(waitpoint.approval_id, "denied", reason="over the limit").resumes
    harness.model_answers(answer("I could not refund A1."))
    assert harness.execute(run_id, owner="worker-2") == Status.COMPLETED

    assert ran == []
    told = harness.script.requests[-1][-1]
    assert told == tool_result(
        waitpoint.tool_call_id, "The call to refund was not run: approval denied. Reason: over the limit"
    )
    assert harness.store.run(run_id).output == "I could not refund A1."


def test_cancelling_a_waiting_run_settles_it_at_once_and_closes_its_approval(harness):
    ran: list[tuple[str, int]] = []
    run_id = _wait_for_refund_approval(harness, ran)

    assert harness.store.cancel(run_id) is True  # no worker holds it
    assert harness.store.run(run_id).status == "cancelled"
    (waitpoint,) = harness.store.waitpoints(run_id)
    assert (waitpoint.decision, waitpoint.reason) == ("cancelled", "run cancelled")
    history, _ = harness.store.checkpoint(run_id)
    assert history[-1] == tool_result(waitpoint.tool_call_id, CLOSED_BY["cancel"])
    assert harness.store.claim(run_id, "worker-2", LEASE) is None
    with pytest.raises(DecisionRefused):
        harness.store.decide(waitpoint.approval_id, "approved")
    assert ran == []


# --- the limits the engine enforces -------------------------------------------------------------


def test_the_step_budget_fails_a_run_that_keeps_calling_tools(harness):
    agent = harness.agent(tools=[add], budget=Budget(max_steps=2))
    run = harness.store.start_run(agent.name, "count")
    harness.model_answers(calls(("add", {"a": 1, "b": 1})), calls(("add", {"a": 2, "b": 2})))

    assert harness.execute(run.pk) == Status.FAILED
    done = harness.store.run(run.pk)
    assert (done.error_code, done.model_calls, done.output) == (ErrorCode.BUDGET_EXCEEDED, 2, None)
    assert len(harness.store.steps(run.pk)) == 4


def test_the_budget_counts_the_model_calls_of_executions_before_a_wait(harness):
    ran: list[tuple[str, int]] = []
    run_id = _wait_for_refund_approval(harness, ran, budget=Budget(max_steps=1))
    (waitpoint,) = harness.store.waitpoints(run_id)
    harness.store.decide(waitpoint.approval_id, "approved")

    # The approved call runs; the model call after it would be the run's second.
    assert harness.execute(run_id, owner="worker-2") == Status.FAILED
    assert ran == [("A1", 30)]
    done = harness.store.run(run_id)
    assert (done.error_code, done.model_calls) == (ErrorCode.BUDGET_EXCEEDED, 1)


def test_a_model_that_keeps_calling_tools_that_do_not_exist_fails_the_run(harness):
    agent = harness.agent(tools=[add])
    run = harness.store.start_run(agent.name, "x")
    harness.model_answers(*[calls(("nope", {}))] * conf.MAX_INVALID_TOOL_CALLS)

    assert harness.execute(run.pk) == Status.FAILED
    assert harness.store.run(run.pk).error_code == ErrorCode.TOOL_LOOP
    assert "there is no tool named 'nope'" in harness.store.steps(run.pk)[1].error


def test_a_stream_cut_before_its_finish_fails_the_run_and_keeps_its_text(harness, monkeypatch):
    class CutStream:
        def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
            on_delta("text", "Half an ans")
            return ModelTurn(text="Half an ans", finish_reason=None, usage=Usage(10, 3))

    monkeypatch.setattr(model_step, "model", lambda agent: CutStream())
    agent = harness.agent()
    run = harness.store.start_run(agent.name, "x")

    assert harness.execute(run.pk) == Status.FAILED
    done = harness.store.run(run.pk)
    assert (done.error_code, done.input_tokens) == (ErrorCode.INCOMPLETE_RESPONSE, 10)
    (step,) = harness.store.steps(run.pk)
    assert (step.output["text"], step.error) == ("Half an ans", INCOMPLETE)
    history, _ = harness.store.checkpoint(run.pk)
    assert history[-1] == {"role": "assistant", "content": "Half an ans"}


def test_a_run_of_an_agent_that_does_not_exist_fails(harness):
    run = harness.store.start_run("decisions-no-such-agent", "x")
    assert harness.execute(run.pk) == Status.FAILED
    assert harness.store.run(run.pk).error_code == ErrorCode.AGENT_NOT_FOUND
