"""OpenTelemetry traces (SPEC §15) in this process, with the SDK's in-memory exporter: message
content only with ``TRACE_CONTENT``; a child run's executions under its parent's run span; a failed
tool and a failed run marked as errors; and a run started with no trace around it is a trace of its
own. ``tests/system/test_tracing.py`` follows a run across a real worker process."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import trace

from chamvi_runs import start_run, store
from chamvi_runs.agents.agent import registry
from chamvi_runs.models import Run
from tests.docsamples import block, load_module
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _named(exporter: Any, prefix: str) -> list[Any]:
    return sorted(
        (s for s in exporter.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time
    )


def test_message_content_is_traced_only_when_the_setting_allows_it(server, settings, exporter):
    for allowed in (False, True):
        settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "TRACE_CONTENT": allowed}
        exporter.clear()
        server.script(
            "m-basic",
            [
                Reply(tool_call("c1", "add", json.dumps({"a": 20, "b": 22})), finish("tool_calls")),
                Reply(text("The sum is 42."), finish("stop"), usage(12, 4)),
            ],
        )
        execute(start_run("basic", "add twenty and twenty-two"))
        (tool,) = _named(exporter, "execute_tool add")
        chats = _named(exporter, "chat m-basic")
        recorded = json.dumps([dict(s.attributes) for s in exporter.get_finished_spans()])
        assert ("The sum is 42." in recorded) is allowed
        assert ("gen_ai.tool.call.arguments" in tool.attributes) is allowed
        if allowed:
            assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"a": 20, "b": 22}
            assert "The sum is 42." in chats[-1].attributes["gen_ai.output.messages"]
        assert "twenty-two" not in recorded  # the prompt is the trigger's: never a span attribute


def test_a_run_started_outside_any_trace_is_a_trace_of_its_own(server, exporter):
    server.script("m-basic", [Reply(text("Hi."), finish("stop"))])
    run = execute(start_run("basic", "x"))
    (root,) = _named(exporter, "chamvi.run basic")
    (execution,) = _named(exporter, "invoke_agent basic")
    assert root.parent is None
    assert execution.parent.span_id == root.context.span_id
    assert execution.context.trace_id == root.context.trace_id
    assert (
        Run.objects.get(pk=run.pk).trace_context["traceparent"].split("-")[1]
        == f"{root.context.trace_id:032x}"
    )


def test_a_failing_tool_and_a_failed_run_are_errors(server, exporter):
    server.script(
        "m-structured",
        [Reply(text("not json"), finish("stop"))],
    )
    run = execute(start_run("structured", "x"))
    assert run.status == "failed"
    (execution,) = _named(exporter, "invoke_agent structured")
    assert execution.status.status_code == trace.StatusCode.ERROR
    assert execution.attributes["chamvi.status"] == "failed"
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "explode", json.dumps({"reason": "boom"})), finish("tool_calls")),
            Reply(text("It broke."), finish("stop")),
        ],
    )
    execute(start_run("basic", "x"))
    (tool,) = _named(exporter, "execute_tool explode")
    assert tool.status.status_code == trace.StatusCode.ERROR
    assert tool.attributes["chamvi.tool.outcome"] == "error"


def test_a_child_runs_executions_are_under_its_parents_run_span(server, exporter):
    server.script(
        "m-triage",
        [
            Reply(tool_call("c1", "billing", '{"task": "refund order 7"}'), finish("tool_calls")),
            Reply(text("Done."), finish("stop")),
        ],
    )
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"))])
    parent = execute(start_run("triage", "x"))
    child = Run.objects.get(parent=parent)
    execute(child)
    execute(parent)
    (root,) = _named(exporter, "chamvi.run triage")
    (child_execution,) = _named(exporter, "invoke_agent billing")
    assert child_execution.parent.span_id == root.context.span_id
    assert child_execution.attributes["chamvi.parent_run.id"] == parent.pk
    assert [e.parent.span_id for e in _named(exporter, "invoke_agent triage")] == [root.context.span_id] * 2


def test_the_documented_tracer_provider_exports_each_span_with_the_sites_service_name():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    sample = load_module("docs_tracing_sample", block("tracing-provider"))
    exported = InMemorySpanExporter()
    provider = sample.tracer_provider(exported)
    with provider.get_tracer("mysite").start_as_current_span("a request"):
        pass
    provider.force_flush()
    (span,) = exported.get_finished_spans()
    assert span.resource.attributes["service.name"] == "mysite"
    provider.shutdown()


def test_an_execution_that_takes_over_from_a_dead_worker_says_it_is_a_recovery(server, exporter):
    server.script("m-basic", [Reply(text("Back."), finish("stop"))])
    run = start_run("basic", "x")
    assert store.claim(run.pk, "gone:1:2:3", 30, registry.versions())
    Run.objects.filter(pk=run.pk).update(claim_expires_at=run.created_at)  # the worker died
    assert execute(run).status == "completed"
    (execution,) = _named(exporter, "invoke_agent basic")
    assert execution.attributes["chamvi.resumed"] is True and execution.attributes["chamvi.attempt"] == 2
    (resumed,) = execution.events
    assert (resumed.name, resumed.attributes["chamvi.after"]) == ("chamvi.resumed", "recovery")
