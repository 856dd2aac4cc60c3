"""Text PostgreSQL cannot store: NUL characters and lone surrogates from callers are refused and
create nothing; from the model and tools they are stored (and streamed) as replacement characters."""

from __future__ import annotations

import json

import pytest

from chamvi_runs import api, approve, send_input, start_run
from chamvi_runs.errors import InvalidPayload
from chamvi_runs.models import Checkpoint, Run, Step, Thread, WaitPoint
from tests.support.helpers import events, execute
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: start_run("basic", {"note": "a\x00b"}), "payload"),
        (lambda: start_run("basic", {"k\x00": 1}), "payload"),
        (lambda: start_run("basic", "x", thread="t\x00"), "thread"),
        (lambda: start_run("basic", "x", concurrency_key="k\x00"), "concurrency_key"),
        (lambda: start_run("basic", "x", id="i\x00"), "id"),
        (lambda: start_run("basic", "x", keys={"user": "u\x00"}), "keys"),
    ],
)
def test_nul_characters_from_callers_are_refused_and_create_nothing(call, what):
    with pytest.raises(InvalidPayload, match=what):
        call()
    assert not Run.objects.exists() and not Thread.objects.exists()


def test_null_and_nul_steering_inputs_are_refused(server):
    run = start_run("basic", "x")
    with pytest.raises(InvalidPayload, match="null"):
        send_input(run.pk, None)
    with pytest.raises(InvalidPayload, match="NUL"):
        send_input(run.pk, "a\x00b")
    assert not run.inputs.exists()
    api.cancel_run(run.pk)


def test_a_decision_reason_with_a_nul_is_refused_and_decides_nothing(server):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    with pytest.raises(InvalidPayload, match="NUL"):
        approve(waitpoint.approval_id, reason="ok\x00")
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


def test_nul_characters_from_the_model_and_tools_are_stored_as_replacement_characters(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "explode", '{"reason": "bad\\u0000byte"}'), finish("tool_calls")),
            Reply(text("done\x00here"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed" and run.output == "done\ufffdhere"
    tool = Step.objects.get(run=run, kind="tool")
    assert tool.input == {"reason": "bad\ufffdbyte"} and "bad\ufffdbyte" in tool.error
    assert "\ufffd" in repr(Checkpoint.objects.get(run=run).messages)


# --- lone surrogates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: start_run("basic", {"note": "a\ud800b"}), "payload"),
        (lambda: start_run("basic", {"\udfff": 1}), "payload"),
        (lambda: start_run("basic", "x", thread="t\ud800"), "thread"),
        (lambda: start_run("basic", "x", concurrency_key="k\udc00"), "concurrency_key"),
        (lambda: start_run("basic", "x", id="i\ud83d"), "id"),
        (lambda: start_run("basic", "x", keys={"user": "u\ud800"}), "keys"),
    ],
)
def test_lone_surrogates_from_callers_are_refused_and_create_nothing(call, what):
    with pytest.raises(InvalidPayload, match=f"{what} must not contain .*lone surrogates"):
        call()
    assert not Run.objects.exists() and not Thread.objects.exists()


def test_lone_surrogates_from_the_model_and_tools_are_stored_streamed_and_sent_on_as_replacements(server):
    # The chunks carry them as JSON escapes, which the openai client decodes to lone surrogates; the
    # arguments are JSON text in a JSON string, whose escape our own parse decodes.
    server.script(
        "m-basic",
        [
            Reply(
                text("half \ud83d of a pair"),
                tool_call("c1", "explode", '{"reason": "bad\\ud800byte"}'),
                finish("tool_calls"),
            ),
            Reply(text("done\udfffhere"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    published = events(run)
    assert run.status == "completed" and run.output == "done\ufffdhere"
    llm = Step.objects.filter(run=run, kind="llm").order_by("index").first()
    assert llm.output["text"] == "half \ufffd of a pair"
    tool = Step.objects.get(run=run, kind="tool")
    assert tool.input == {"reason": "bad\ufffdbyte"} and "bad\ufffdbyte" in tool.error
    deltas = "".join(e["text"] for e in published if e["type"] == "delta" and e["step"] == llm.index)
    assert deltas == llm.output["text"]
    assert "\ufffd" in repr(Checkpoint.objects.get(run=run).messages)
    # The second model call got the tool's error as its result: the request could be encoded.
    assert "bad\ufffdbyte" in json.dumps(server.requests[-1]["messages"], ensure_ascii=False)
