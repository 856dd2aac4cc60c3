"""One execution end to end through the real openai client and the scripted server."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chamvi_runs import start_run
from chamvi_runs.models import Checkpoint, Step, WaitPoint
from tests.support.helpers import events, execute, first_user_block
from tests.support.scripted_server import Reply, finish, reasoning, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def test_text_answer_completes_with_steps_checkpoint_and_usage(server):
    server.script(
        "m-basic", [Reply(reasoning("hmm "), text("Hel"), text("lo"), finish("stop"), usage(11, 3))]
    )
    run = start_run("basic", {"title": "hi"}, keys={"k": 1}, thread=None)
    run = execute(run)
    assert run.status == "completed"
    assert run.output == "Hello"
    assert (run.input_tokens, run.output_tokens, run.model_calls) == (11, 3, 1)
    assert run.started_at is not None and run.finished_at is not None
    assert run.claim_owner is None
    step = Step.objects.get(run=run)
    assert (step.index, step.kind, step.output["text"], step.output["reasoning"]) == (
        0,
        "llm",
        "Hello",
        "hmm ",
    )
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.step_index == 0
    assert checkpoint.messages[-1] == {"role": "assistant", "content": "Hello"}
    request = server.requests_for("m-basic")[0]
    assert request["messages"][0] == {"role": "system", "content": "You are basic."}
    assert first_user_block(request) == {"source": "api", "trigger": "api", "payload": {"title": "hi"}}
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}


def test_deltas_are_broadcast_in_order_and_match_the_stored_step(server):
    server.script(
        "m-basic", [Reply(reasoning("a"), reasoning("b"), text("x"), text("y"), text("z"), finish("stop"))]
    )
    run = execute(start_run("basic", "go"))
    stream = events(run)
    assert [e["seq"] for e in stream] == list(range(1, len(stream) + 1))
    assert stream[0]["type"] == "run.start" and stream[-1]["type"] == "run.end"
    text_deltas = "".join(e["text"] for e in stream if e["type"] == "delta" and e["kind"] == "text")
    reasoning_deltas = "".join(e["text"] for e in stream if e["type"] == "delta" and e["kind"] == "reasoning")
    step = Step.objects.get(run=run)
    assert text_deltas == step.output["text"] == "xyz"
    assert reasoning_deltas == "ab"
    assert stream[-1]["status"] == "completed" and stream[-1]["output"] == "xyz"


def test_tool_call_then_final_answer(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("call_1", "add", '{"a": 2, "b": 3}'), finish("tool_calls"), usage(5, 5)),
            Reply(text("It is 5."), finish("stop"), usage(7, 2)),
        ],
    )
    run = execute(start_run("basic", "add"))
    assert run.status == "completed" and run.output == "It is 5."
    steps = list(Step.objects.filter(run=run).values_list("index", "kind", "name", "output", "error"))
    assert steps[0][:3] == (0, "llm", "m-basic")
    assert steps[1] == (1, "tool", "add", 5, "")
    assert steps[2][:2] == (2, "llm")
    second = server.requests_for("m-basic")[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "call_1"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert (run.input_tokens, run.output_tokens, run.model_calls) == (12, 7, 2)


def test_a_run_settled_by_its_first_execution_reads_no_wait_points(server):
    # Wait points are opened by an execution that then ends waiting: the first execution of a run
    # that settles found none, and its run.end needs no query for decisions.
    server.script("m-basic", [Reply(text("Hi"), finish("stop"), usage(1, 1))])
    run = start_run("basic", "go")
    with CaptureQueriesContext(connection) as queries:
        run = execute(run)
    assert run.status == "completed"
    assert not [q["sql"] for q in queries if WaitPoint._meta.db_table in q["sql"]]
    assert events(run)[-1]["decisions"] == []
