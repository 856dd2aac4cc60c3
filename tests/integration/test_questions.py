"""Questions (SPEC §12): a ``human_tool`` call makes the run wait, without a worker, for its user's
answer; the answer, checked against the question's schema and recorded once, becomes the tool's
result for the model."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pydantic
import pytest
from django.utils import timezone

from chamvi_runs import Agent, answer, approve, cancel_run, deny, start_run
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.errors import DecisionRefused, InvalidAnswer
from chamvi_runs.models import Checkpoint, Run, Step, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.runtime.tool_calls import NO_ANSWER
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, finish, text, tool_call, usage
from tests.testapp.agents import Shipping, ask_user
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

# Registered here, not in tests/testapp: only in-process executions of this module run it.
asking_fail = Agent(
    name="asking_fail",
    model="m-asking_fail",
    instructions="You ask, and fail when an approval expires.",
    tools=[ask_user],
    on_approval_expired="fail",
)


def call(call_id: str, name: str, arguments: str = '{"question": "?"}') -> Any:
    return tool_call(call_id, name, arguments)


def asked(server, *calls: Any, agent: str = "asking") -> Run:
    """A run of ``agent`` whose first model call made ``calls``, executed until it waits."""
    server.script(f"m-{agent}", [Reply(text("Let me ask."), *calls, finish("tool_calls"), usage(10, 5))])
    run = execute(start_run(agent, "ship my order"))
    assert run.status == "waiting", (run.status, run.error_code, run.error_message)
    return run


def open_waits(run: Run) -> list[WaitPoint]:
    return list(WaitPoint.objects.filter(run=run, decision__isnull=True).order_by("call_position"))


def tool_messages(server, model: str, request: int = -1) -> list[dict[str, Any]]:
    """The tool messages of a request the scripted server received (the last by default)."""
    return [m for m in server.requests_for(model)[request]["messages"] if m["role"] == "tool"]


def of_type(run: Run, type_: str) -> list[dict[str, Any]]:
    return [e for e in events(run) if e["type"] == type_]


def queued(queue) -> list[str]:
    return [job.args[0] for job in queue.get_jobs()]


# --- asking ---------------------------------------------------------------------------------------


def test_a_question_waits_without_a_claim_and_run_waiting_says_what_it_asks(server):
    run = asked(server, call("c1", "choose_shipping", '{"question": "How should we ship it?"}'))
    assert run.claim_owner is None and run.model_calls == 1
    steps = list(Step.objects.filter(run=run).order_by("index").values_list("index", "kind", "name"))
    assert steps == [(0, "llm", "m-asking"), (1, "wait", "choose_shipping")]
    (waitpoint,) = open_waits(run)
    schema = pydantic.TypeAdapter(Shipping).json_schema()
    assert waitpoint.kind == "input" and waitpoint.tool_name == "choose_shipping"
    assert waitpoint.input == {"question": "How should we ship it?"}
    assert waitpoint.answer_schema == schema and waitpoint.answer is None
    assert waitpoint.client is False and waitpoint.approved_input is None
    # The question's own ttl (600 s), not the agent's or the default approval ttl.
    assert timedelta(seconds=590) < waitpoint.expires_at - timezone.now() < timedelta(seconds=610)
    assert [c["id"] for c in open_tool_calls(Checkpoint.objects.get(run=run).messages)] == ["c1"]
    (waiting,) = of_type(run, "run.waiting")
    assert waiting["approval_id"] == waitpoint.approval_id
    assert waiting["kind"] == "input" and waiting["tool_name"] == "choose_shipping"
    assert waiting["question"] == "How should we ship it?"
    assert waiting["answer_schema"] == schema and waiting["client"] is False
    assert waiting["input"] == {"question": "How should we ship it?"}
    assert waiting["editable"] is False
    assert not of_type(run, "tool.call"), "a question is announced by run.waiting, not as a call"


def test_a_client_question_is_marked_client_and_may_take_any_answer(server):
    run = asked(server, call("c1", "browser_locale", "{}"))
    (waitpoint,) = open_waits(run)
    (waiting,) = of_type(run, "run.waiting")
    assert waiting["client"] is True and waitpoint.client is True
    # A client question need not ask anything: the page knows what the tool is for.
    assert waiting["answer_schema"] is None and not waiting["question"]
    answer(waitpoint.approval_id, {"locale": "fr-CA", "offset": -300})
    server.script("m-asking", [Reply(text("Bonjour."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    told = json.loads(tool_messages(server, "m-asking")[0]["content"])
    assert told == {"locale": "fr-CA", "offset": -300}


def test_an_answer_requeues_the_run_and_becomes_the_tool_result_the_model_reads(server, queue):
    run = asked(server, call("c1", "ask_user", '{"question": "Which colour?"}'))
    (waitpoint,) = open_waits(run)
    queue.empty()
    decided = answer(waitpoint.approval_id, "Blue")
    assert decided.decision == "answered" and decided.answer == "Blue"
    run.refresh_from_db()
    assert run.status == "running" and run.claim_owner is None
    assert queued(queue) == [run.pk]
    server.script("m-asking", [Reply(text("Blue it is."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.output == "Blue it is."
    (told,) = tool_messages(server, "m-asking")
    assert told == {"role": "tool", "tool_call_id": "c1", "content": "Blue"}
    resume = of_type(run, "run.resume")[0]
    assert resume["decision"]["kind"] == "input" and resume["decision"]["answer"] == "Blue"
    assert resume["decision"]["decision"] == "answered"
    (announced,) = of_type(run, "tool.call")
    assert announced["tool_call_id"] == "c1" and announced["name"] == "ask_user"
    (result,) = of_type(run, "tool.result")
    assert result["tool_call_id"] == "c1" and result["output"] == "Blue" and "error" not in result
    kinds = list(Step.objects.filter(run=run).order_by("index").values_list("kind", "name"))
    assert kinds == [("llm", "m-asking"), ("wait", "ask_user"), ("tool", "ask_user"), ("llm", "m-asking")]
    (end,) = of_type(run, "run.end")
    assert [(d["kind"], d["decision"], d["answer"]) for d in end["decisions"]] == [
        ("input", "answered", "Blue")
    ]


def test_an_answer_the_schema_refuses_names_the_field_and_records_nothing(server, queue):
    run = asked(server, call("c1", "choose_shipping", '{"question": "How?"}'))
    (waitpoint,) = open_waits(run)
    queue.empty()
    with pytest.raises(InvalidAnswer) as refused:
        answer(waitpoint.approval_id, {"speed": "slow"})
    assert refused.value.code == "invalid_answer"
    assert "speed" in str(refused.value)
    with pytest.raises(InvalidAnswer) as wrong_type:
        answer(waitpoint.approval_id, "express")
    assert wrong_type.value.code == "invalid_answer"
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.answer, waitpoint.decided_at) == (None, None, None)
    assert Run.objects.get(pk=run.pk).status == "waiting" and queued(queue) == []
    # Still open: a good answer is taken, as the schema made it (defaults filled in).
    assert answer(waitpoint.approval_id, {"speed": "express"}).answer == {"speed": "express", "gift": False}
    server.script("m-asking", [Reply(text("Express."), finish("stop"))])
    assert execute(run).status == "completed"
    # (PostgreSQL's jsonb keeps keys in its own order.)
    assert json.loads(tool_messages(server, "m-asking")[0]["content"]) == {"speed": "express", "gift": False}


def test_a_second_answer_is_refused_and_the_first_stands(server):
    run = asked(server, call("c1", "confirm", '{"question": "Sure?"}'))
    (waitpoint,) = open_waits(run)
    answer(waitpoint.approval_id, True)
    with pytest.raises(DecisionRefused) as again:
        answer(waitpoint.approval_id, False)
    assert again.value.code == "already_decided"
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.answer) == ("answered", True)
    server.script("m-asking", [Reply(text("ok"), finish("stop"))])
    execute(run)
    assert tool_messages(server, "m-asking")[0]["content"] == "true"


@pytest.mark.parametrize("agent", ["asking", "asking_fail"])
def test_an_expired_question_tells_the_model_no_answer_came_and_the_run_goes_on(server, agent):
    """Even for an agent that fails when an approval expires: a question is not an approval."""
    run = asked(server, call("c1", "ask_user", '{"question": "Still there?"}'), agent=agent)
    (waitpoint,) = open_waits(run)
    WaitPoint.objects.filter(pk=waitpoint.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(DecisionRefused) as late:
        answer(waitpoint.approval_id, "yes")
    assert late.value.code == "expired"
    assert tick_once().expired == 1
    waitpoint.refresh_from_db()
    assert waitpoint.decision == "expired" and waitpoint.answer is None
    assert Run.objects.get(pk=run.pk).status == "running"
    server.script(f"m-{agent}", [Reply(text("No answer, so I stop."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed", (run.error_code, run.error_message)
    (told,) = tool_messages(server, f"m-{agent}")
    assert told["tool_call_id"] == "c1" and NO_ANSWER in told["content"]
    assert [e["output"] for e in of_type(run, "tool.result")] == [NO_ANSWER]


def test_cancelling_a_run_that_waits_for_an_answer_closes_the_question(server):
    run = asked(server, call("c1", "ask_user"), call("c2", "confirm"), agent="asking_two")
    assert cancel_run(run.pk) == "cancelled"
    assert set(WaitPoint.objects.filter(run=run).values_list("decision", flat=True)) == {"cancelled"}
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)
    for waitpoint in WaitPoint.objects.filter(run=run):
        with pytest.raises(DecisionRefused) as refused:
            answer(waitpoint.approval_id, {"ask_user": "Ada", "confirm": True}[waitpoint.tool_name])
        assert refused.value.code == "already_decided"
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    (end,) = of_type(run, "run.end")
    assert end["status"] == "cancelled"
    assert [d["decision"] for d in end["decisions"]] == ["cancelled", "cancelled"]


# --- two questions at once ------------------------------------------------------------------------


def two_questions(server) -> tuple[Run, WaitPoint, WaitPoint]:
    run = asked(
        server,
        call("c1", "ask_user", '{"question": "Your name?"}'),
        call("c2", "confirm", '{"question": "Subscribe?"}'),
        agent="asking_two",
    )
    first, second = open_waits(run)
    return run, first, second


def test_two_questions_of_one_model_call_wait_together(server):
    run, first, second = two_questions(server)
    assert [(w.tool_name, w.call_position, w.tool_call_id) for w in (first, second)] == [
        ("ask_user", 0, "c1"),
        ("confirm", 1, "c2"),
    ]
    assert [w["approval_id"] for w in of_type(run, "run.waiting")] == [first.approval_id, second.approval_id]
    assert [w["question"] for w in of_type(run, "run.waiting")] == ["Your name?", "Subscribe?"]
    assert [w["answer_schema"] for w in of_type(run, "run.waiting")] == [
        {"type": "string"},
        {"type": "boolean"},
    ]
    kinds = list(Step.objects.filter(run=run).order_by("index").values_list("kind", "name"))
    assert kinds == [("llm", "m-asking_two"), ("wait", "ask_user"), ("wait", "confirm")]


def test_answering_the_second_question_first_keeps_waiting_until_both_are_answered(server, queue):
    run, first, second = two_questions(server)
    queue.empty()
    assert answer(second.approval_id, True).resumes is False
    assert Run.objects.get(pk=run.pk).status == "waiting" and queued(queue) == []
    assert [w.pk for w in open_waits(run)] == [first.pk]
    assert answer(first.approval_id, "Ada").resumes is True
    assert Run.objects.get(pk=run.pk).status == "running" and queued(queue) == [run.pk]
    server.script("m-asking_two", [Reply(text("Hello Ada."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    # Both answers reach the model, in the order of the calls, not of the answers.
    told = tool_messages(server, "m-asking_two")
    assert [(m["tool_call_id"], m["content"]) for m in told] == [("c1", "Ada"), ("c2", "true")]
    assert [(e["tool_call_id"], e["output"]) for e in of_type(run, "tool.result")] == [
        ("c1", "Ada"),
        ("c2", True),
    ]
    assert len(server.requests_for("m-asking_two")) == 2


def test_one_of_two_questions_expires_and_the_model_gets_the_other_answer(server, queue):
    run, first, second = two_questions(server)
    queue.empty()
    WaitPoint.objects.filter(pk=first.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert tick_once().expired == 1
    # The other question is still open: the run waits for it, nothing is queued.
    assert Run.objects.get(pk=run.pk).status == "waiting" and queued(queue) == []
    answer(second.approval_id, True)
    assert queued(queue) == [run.pk]
    server.script("m-asking_two", [Reply(text("ok"), finish("stop"))])
    assert execute(run).status == "completed"
    told = [(m["tool_call_id"], m["content"]) for m in tool_messages(server, "m-asking_two")]
    assert told == [("c1", NO_ANSWER), ("c2", "true")]


def test_two_questions_expiring_in_one_tick_requeue_the_run_once(server, queue):
    run, *_ = two_questions(server)
    queue.empty()
    WaitPoint.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert tick_once().expired == 2
    assert Run.objects.get(pk=run.pk).status == "running" and queued(queue) == [run.pk]
    server.script("m-asking_two", [Reply(text("Nobody answered."), finish("stop"))])
    assert execute(run).status == "completed"
    assert [m["content"] for m in tool_messages(server, "m-asking_two")] == [NO_ANSWER, NO_ANSWER]


def test_calls_after_a_question_in_the_same_model_call_run_once_it_is_answered(server):
    run = asked(
        server, call("c1", "ask_user", '{"question": "How many?"}'), call("c2", "add", '{"a": 2, "b": 3}')
    )
    (waitpoint,) = open_waits(run)
    assert not of_type(run, "tool.call"), "nothing after the question ran before its answer"
    answer(waitpoint.approval_id, "two")
    server.script("m-asking", [Reply(text("done"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(server, "m-asking")] == [
        ("c1", "two"),
        ("c2", "5"),
    ]


def test_a_question_then_an_approval_in_one_model_call_wait_one_after_the_other(server):
    run = asked(
        server,
        call("c1", "ask_user", '{"question": "Which order?"}'),
        call("c2", "refund", '{"order_id": "o-1", "amount_cents": 500}'),
    )
    (question,) = open_waits(run)
    assert question.kind == "input"
    answer(question.approval_id, "o-1")
    run = execute(run)
    assert run.status == "waiting"
    (approval,) = open_waits(run)
    assert (approval.kind, approval.tool_name, approval.call_position) == ("approval", "refund", 1)
    approve(approval.approval_id)
    server.script("m-asking", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and Refund.objects.get().amount_cents == 500
    assert tool_messages(server, "m-asking")[0]["content"] == "o-1"


# --- the wrong verb -------------------------------------------------------------------------------


def test_a_question_is_answered_not_approved_or_denied(server):
    run = asked(server, call("c1", "confirm", '{"question": "Sure?"}'))
    (waitpoint,) = open_waits(run)
    for decide in (approve, deny):
        with pytest.raises(DecisionRefused) as refused:
            decide(waitpoint.approval_id)
        assert refused.value.code == "wrong_kind"
    waitpoint.refresh_from_db()
    assert waitpoint.decision is None and Run.objects.get(pk=run.pk).status == "waiting"
    answer(waitpoint.approval_id, False)
    server.script("m-asking", [Reply(text("ok"), finish("stop"))])
    execute(run)


def test_an_approval_is_approved_not_answered(server):
    run = asked(server, call("c1", "refund", '{"order_id": "o-1", "amount_cents": 500}'))
    (waitpoint,) = open_waits(run)
    assert waitpoint.kind == "approval"
    with pytest.raises(DecisionRefused) as refused:
        answer(waitpoint.approval_id, "yes")
    assert refused.value.code == "wrong_kind"
    waitpoint.refresh_from_db()
    assert (waitpoint.decision, waitpoint.answer) == (None, None)
    assert Run.objects.get(pk=run.pk).status == "waiting" and not Refund.objects.exists()


def test_an_unknown_question_is_not_found():
    with pytest.raises(DecisionRefused) as refused:
        answer("apr_nope", "x")
    assert refused.value.code == "not_found"


# --- an execution that finds questions open -------------------------------------------------------


def test_a_duplicate_job_of_a_run_waiting_for_answers_writes_nothing(server):
    run, *questions = two_questions(server)
    before = list(Step.objects.filter(run=run).values_list("pk", flat=True))
    assert execute(run).status == "waiting"
    assert list(Step.objects.filter(run=run).values_list("pk", flat=True)) == before
    assert len(server.requests_for("m-asking_two")) == 1
    assert [w.pk for w in open_waits(run)] == [w.pk for w in questions]


def test_an_execution_that_finds_one_of_two_questions_open_goes_back_to_waiting(server):
    """As after a worker restart that re-ran the run between the two answers: the run is claimed,
    finds a question still open, and waits again without a model call or a step."""
    run, first, second = two_questions(server)
    answer(first.approval_id, "Ada")
    Run.objects.filter(pk=run.pk).update(status="running")
    count = Step.objects.filter(run=run).count()
    run = execute(run)
    assert run.status == "waiting" and run.claim_owner is None
    assert Step.objects.filter(run=run).count() == count
    assert len(server.requests_for("m-asking_two")) == 1
    assert [w.pk for w in open_waits(run)] == [second.pk]
    assert not of_type(run, "tool.call")
    # The open question still decides when the run goes on, with both answers.
    answer(second.approval_id, False)
    server.script("m-asking_two", [Reply(text("ok"), finish("stop"))])
    assert execute(run).status == "completed"
    assert [m["content"] for m in tool_messages(server, "m-asking_two")] == ["Ada", "false"]
