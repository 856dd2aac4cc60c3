"""Every failure rule of SPEC §5, each with its stable error code."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile

from chamvi_runs import start_run
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.models import Artifact, Checkpoint, Step
from chamvi_runs.runtime.artifacts import save_artifact
from tests.support.helpers import events, execute
from tests.support.scripted_server import (
    Reply,
    cut,
    delay,
    error_event,
    finish,
    http_error,
    text,
    tool_call,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def test_model_error_mid_stream_keeps_text_so_far_then_fails(server):
    server.script("m-basic", [Reply(text("Half an "), text("answer"), error_event("upstream exploded"))])
    run = execute(start_run("basic", "x"))
    assert run.status == "failed"
    assert run.error_code == "model_error" and "upstream exploded" in run.error_message
    step = Step.objects.get(run=run)
    assert step.kind == "llm" and step.output["text"] == "Half an answer"
    assert step.output["finish_reason"] == "error" and "upstream exploded" in step.error
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.finish_reason == "error"
    assert checkpoint.messages[-1] == {"role": "assistant", "content": "Half an answer"}
    assert events(run)[-1]["error"] == {"code": "model_error", "message": run.error_message}


@pytest.mark.parametrize("graceful", [False, True], ids=["dropped", "ended-without-finish"])
def test_cut_stream_fails_incomplete_and_runs_no_tool_of_that_step(server, graceful):
    server.script(
        "m-basic",
        [
            Reply(
                text("Refunding"),
                tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 1}'),
                cut(graceful),
            )
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "failed" and run.error_code == "incomplete_response"
    assert list(Step.objects.filter(run=run).values_list("kind", flat=True)) == ["llm"]
    from tests.testapp.models import Refund

    assert not Refund.objects.exists()
    messages = Checkpoint.objects.get(run=run).messages
    assert not open_tool_calls(messages), "a history never ends on tool calls without results"


def test_rate_limit_and_server_errors_are_retried_then_succeed(server):
    server.script(
        "m-basic",
        [
            Reply(http_error(429, "slow down")),
            Reply(http_error(503, "busy")),
            Reply(text("ok"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed" and run.output == "ok"
    assert len(server.requests_for("m-basic")) == 3
    assert Step.objects.filter(run=run).count() == 1


def test_retries_are_bounded_then_model_error(server, settings):
    settings.CHAMVI_RUNS = {
        **settings.CHAMVI_RUNS,
        "OPENAI": {**settings.CHAMVI_RUNS["OPENAI"], "max_retries": 1},
    }
    server.script("m-basic", [Reply(http_error(500, "down")), Reply(http_error(500, "still down"))])
    run = execute(start_run("basic", "x"))
    assert run.status == "failed" and run.error_code == "model_error"
    assert "still down" in run.error_message
    assert len(server.requests_for("m-basic")) == 2


def test_client_errors_are_not_retried(server):
    server.script("m-basic", [Reply(http_error(400, "bad request: context too long"))])
    run = execute(start_run("basic", "x"))
    assert run.status == "failed" and run.error_code == "model_error"
    assert "context too long" in run.error_message
    assert len(server.requests_for("m-basic")) == 1


def test_unknown_tool_invalid_arguments_and_raising_tool_are_told_to_the_model(server):
    server.script(
        "m-basic",
        [
            Reply(
                tool_call("c1", "teleport", "{}"),
                tool_call("c2", "add", '{"a": "two", "b": 3}'),
                tool_call("c3", "explode", '{"reason": "boom"}'),
                tool_call("c4", "add", "{not json"),
                finish("tool_calls"),
            ),
            Reply(text("Sorry."), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed"
    tool_steps = list(Step.objects.filter(run=run, kind="tool").order_by("index"))
    assert [s.name for s in tool_steps] == ["teleport", "add", "explode", "add"]
    assert "no tool named 'teleport'" in tool_steps[0].error
    assert "invalid arguments for add" in tool_steps[1].error and "a:" in tool_steps[1].error
    assert tool_steps[2].error == "RuntimeError: exploded: boom"
    assert "not valid JSON" in tool_steps[3].error
    results = [m for m in server.requests_for("m-basic")[1]["messages"] if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == ["c1", "c2", "c3", "c4"]
    assert all(r["content"].startswith("Error: ") for r in results)
    assert "exploded: boom" in results[2]["content"]


def test_repeated_invalid_calls_fail_the_run_instead_of_looping(server):
    bad = [Reply(tool_call(f"c{n}", "teleport", "{}"), finish("tool_calls")) for n in range(3)]
    server.script("m-basic", bad)
    run = execute(start_run("basic", "x"))
    assert run.status == "failed" and run.error_code == "tool_loop"
    assert run.model_calls == 3
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


def test_tool_turn_reported_with_finish_reason_stop_still_runs_the_tools(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 1}'), finish("stop")),
            Reply(text("2"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed" and run.output == "2"
    assert Step.objects.get(run=run, kind="tool").output == 2


def test_repeated_tool_call_indexes_are_assembled_as_separate_calls(server):
    server.script(
        "m-basic",
        [
            Reply(
                tool_call("c1", "add", '{"a": 1, "b": 2}', index=0),
                tool_call("c2", "add", '{"a": 10, "b": 20}', index=0),
                finish("tool_calls"),
            ),
            Reply(text("3 and 30"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert list(Step.objects.filter(run=run, kind="tool").values_list("output", flat=True)) == [3, 30]


def test_max_steps_fails_with_budget_exceeded(server):
    server.script(
        "m-limited",
        [Reply(tool_call(f"c{n}", "add", '{"a": 1, "b": 1}'), finish("tool_calls")) for n in range(2)],
    )
    run = execute(start_run("limited", "x"))
    assert run.status == "failed" and run.error_code == "budget_exceeded"
    assert run.model_calls == 2
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


def test_a_final_answer_on_the_last_allowed_step_completes(server):
    server.script(
        "m-limited",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 1}'), finish("tool_calls")),
            Reply(text("2"), finish("stop")),
        ],
    )
    run = execute(start_run("limited", "x"))
    assert run.status == "completed" and run.output == "2"


def test_max_tokens_counts_usage_and_fails(server):
    server.script(
        "m-token_limited",
        [Reply(tool_call("c1", "add", '{"a": 1, "b": 1}'), finish("tool_calls"), usage(40, 20))],
    )
    run = execute(start_run("token_limited", "x"))
    assert run.status == "failed" and run.error_code == "budget_exceeded"
    assert run.input_tokens + run.output_tokens == 60


def test_timeout_per_execution_aborts_the_model_call(server):
    server.script("m-timed", [Reply(text("thinking"), delay(5), text("late"), finish("stop"))])
    run = execute(start_run("timed", "x"))
    assert run.status == "failed" and run.error_code == "timeout"
    assert not Step.objects.filter(run=run).exists(), "an aborted model call writes no step"


def test_structured_output_is_parsed_into_output(server):
    server.script("m-structured", [Reply(text('{"label": "bug", '), text('"score": 0.9}'), finish("stop"))])
    run = execute(start_run("structured", "x"))
    assert run.status == "completed" and run.output == {"label": "bug", "score": 0.9}
    request = server.requests_for("m-structured")[0]
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"]["required"] == ["label", "score"]


def test_structured_output_that_does_not_fit_fails_the_run(server):
    server.script("m-structured", [Reply(text('{"label": "bug"}'), finish("stop"))])
    run = execute(start_run("structured", "x"))
    assert run.status == "failed" and run.error_code == "invalid_output"


def test_json_schema_dict_output(server):
    server.script("m-schema_dict", [Reply(text('{"answer": "42"}'), finish("stop"))])
    run = execute(start_run("schema_dict", "x"))
    assert run.output == {"answer": "42"}


def test_missing_artifact_fails_the_run(server):
    artifact = save_artifact(b"hello", "note.txt")
    run = start_run("basic", "read it", attachments=[artifact])
    artifact.file.delete(save=False)
    Artifact.objects.filter(pk=artifact.pk).delete()
    run = execute(run)
    assert run.status == "failed" and run.error_code == "artifact_not_found"
    assert artifact.pk in run.error_message


def test_attachments_are_sent_as_parts_and_checkpoints_keep_references(server):
    image = save_artifact(ContentFile(b"\x89PNG fake"), "shot.png")
    doc = save_artifact(b"%PDF fake", "spec.pdf")
    server.script("m-basic", [Reply(text("seen"), finish("stop"))])
    run = execute(start_run("basic", "look", attachments=[image, doc.pk]))
    assert run.status == "completed"
    parts = server.requests_for("m-basic")[0]["messages"][1]["content"]
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    assert parts[2]["type"] == "file" and parts[2]["file"]["filename"] == "spec.pdf"
    assert parts[2]["file"]["file_data"].startswith("data:application/pdf;base64,")
    stored = Checkpoint.objects.get(run=run).messages[0]["content"]
    assert stored[1]["file"]["file_data"] == f"chamvi-artifact:{image.pk}"
    assert "base64" not in str(stored)


def test_unknown_agent_fails_with_agent_not_found(server):
    run = start_run("basic", "x")
    # A run recorded before agent versions were: any worker takes it, and finds no such agent.
    type(run).objects.filter(pk=run.pk).update(agent="vanished", agent_version="")
    run = execute(run)
    assert run.status == "failed" and run.error_code == "agent_not_found"


def test_a_run_of_an_agent_this_process_does_not_have_is_left_for_a_worker_that_has_it(server):
    # During a deploy that adds an agent, an old worker must not fail the new agent's runs.
    run = start_run("basic", "x")
    type(run).objects.filter(pk=run.pk).update(agent="added_by_the_next_release")
    run = execute(run)
    assert (run.status, run.error_code, run.attempt) == ("queued", "", 0)
