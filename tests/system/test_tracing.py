"""OpenTelemetry traces (SPEC §15) across a real ``rqworker``: a run started by an HTTP request is a
subtree of that request's trace, through the queue and across its executions (an approval pause in
between), with GenAI spans for its model and tool calls; no span holds a token, and no message
content unless ``TRACE_CONTENT`` allows it. This process exports to the SDK's in-memory exporter,
the worker to a file (``tests/support/tracing.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from chamvi_runs import approve
from chamvi_runs.models import Run, WaitPoint
from tests.support.helpers import make_superuser, session_api
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, finish, text, tool_call, usage
from tests.support.tracing import TRACE_FILE, read

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = json.dumps({"order_id": "o-secret-77", "amount_cents": 500})


def _hex(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def _every_value(spans: list[dict[str, Any]]) -> str:
    """Every attribute and event of ``spans``, as one text to search."""
    return json.dumps([[s.get("attributes"), s.get("events")] for s in spans])


def test_a_runs_spans_join_the_trace_of_the_request_that_started_it_across_worker_and_pause(
    server, spawn, exporter, tmp_path: Path
):
    server.script(
        "m-approving",
        [
            Reply(
                text("Let me "),
                text("refund."),
                tool_call("c1", "refund", REFUND),
                finish("tool_calls"),
                usage(30, 9),
            ),
            Reply(text("Refunded."), finish("stop"), usage(41, 3)),
        ],
    )
    path = tmp_path / "worker-spans.jsonl"
    worker = spawn(env={TRACE_FILE: str(path)})
    api = session_api(make_superuser())
    # What a site's Django instrumentation does for every request: a span the view runs in.
    with trace.get_tracer("site").start_as_current_span("POST /chamvi/api/runs/") as request:
        response = api.post(
            "/chamvi/api/runs/", {"agent": "approving", "payload": "refund order o-secret-77"}
        )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait_for(lambda: Run.objects.get(pk=run_id).status == "waiting", 30, worker.output)
    approval = WaitPoint.objects.get(run_id=run_id)
    approve(approval.approval_id)
    wait_for(lambda: Run.objects.get(pk=run_id).status == "completed", 30, worker.output)

    trace_id = _hex(request.get_span_context().trace_id, 32)
    (run_span,) = [s for s in exporter.get_finished_spans() if s.name == "chamvi.run approving"]
    assert run_span.parent.span_id == request.get_span_context().span_id
    wait_for(
        lambda: len([s for s in read(str(path)) if s["name"].startswith("invoke_agent")]) == 2, 10, "spans"
    )
    spans = read(str(path))
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}
    executions = sorted(
        (s for s in spans if s["name"] == "invoke_agent approving"), key=lambda s: s["start_time"]
    )
    assert [e["parent_id"] for e in executions] == [_hex(run_span.context.span_id, 16)] * 2
    first, second = executions
    assert first["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert first["attributes"]["chamvi.run.id"] == run_id
    assert [e["name"] for e in first["events"]] == ["chamvi.approval"]
    assert first["events"][0]["attributes"]["gen_ai.tool.name"] == "refund"
    assert first["attributes"]["chamvi.status"] == "waiting"
    assert second["attributes"]["chamvi.resumed"] is True
    assert second["events"][0]["attributes"]["chamvi.after"] == "approved"
    assert second["attributes"]["chamvi.status"] == "completed"

    chats = sorted((s for s in spans if s["name"] == "chat m-approving"), key=lambda s: s["start_time"])
    assert [c["parent_id"] for c in chats] == [first["context"]["span_id"], second["context"]["span_id"]]
    usage_seen = [
        (c["attributes"]["gen_ai.usage.input_tokens"], c["attributes"]["gen_ai.usage.output_tokens"])
        for c in chats
    ]
    assert usage_seen == [(30, 9), (41, 3)]
    assert chats[0]["attributes"]["gen_ai.operation.name"] == "chat"
    assert chats[0]["attributes"]["gen_ai.request.model"] == "m-approving"
    assert chats[0]["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert 0 < chats[0]["attributes"]["gen_ai.response.time_to_first_chunk"] < 10
    (tool,) = [s for s in spans if s["name"] == "execute_tool refund"]
    assert tool["parent_id"] == second["context"]["span_id"]  # it ran once approved
    assert tool["attributes"]["gen_ai.tool.name"] == "refund"
    assert tool["attributes"]["chamvi.tool.outcome"] == "ok"

    # No token, no secret, no content: the approval's token and the API key never, the payload,
    # the answer and the tool's arguments only with TRACE_CONTENT.
    everything = _every_value([*spans, json.loads(run_span.to_json())])
    for secret in ("o-secret-77", "Refunded", "Let me", approval.token_hash):
        assert secret not in everything, secret
