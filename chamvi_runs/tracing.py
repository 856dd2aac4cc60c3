"""OpenTelemetry traces of runs (SPEC §15; the ``otel`` extra: opentelemetry-api). The app connects
``connect``'s receivers when the API is installed; everything the engine does reaches them through
``chamvi_runs.signals``, and the spans go to whatever tracer provider the site configured (none: the
API's no-op).

A run is one subtree of the trace that started it: ``start_run`` (an HTTP request's view, a task)
opens a ``chamvi.run`` span under the current span, ends it at once, and the run keeps its context
(``Run.trace_context``, W3C trace context) for every execution to come, in any process, however
long the run waits. Each execution is an ``invoke_agent`` span under it; each model call a
``chat`` span and each tool call an ``execute_tool`` span under that, with the GenAI semantic
conventions' attributes (operation, model, usage, finish reasons, time to the first chunk, tool
name and call id). Approvals and questions are events of the execution that asked them; a resumed
execution says what it resumes after; a child run's executions are under its parent's run span.

No span holds a token or a secret: no approval token, no API key, no header. Message content (the
prompt, the answer, tool arguments and results) is recorded only with
``CHAMVI_RUNS["TRACE_CONTENT"] = True``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from . import signals
from .conf import conf
from .models import Run

logger = logging.getLogger(__name__)

tracer = trace.get_tracer("chamvi_runs")


@dataclass
class _Execution:
    span: Span
    token: object
    """The span made current in the executing thread: what a tool does (an instrumented HTTP call,
    a query) is traced under it."""
    first_chunk: dict[int, int] = field(default_factory=dict)
    """Each model call's (step index) first streamed chunk, in ns since the epoch."""


_executions: dict[str, _Execution] = {}
_lock = threading.Lock()


def _safe(receiver: Callable[..., None]) -> Callable[..., None]:
    """Tracing must never break a run: a receiver that fails logs and returns."""

    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:
            logger.warning("tracing: %s failed", receiver.__name__, exc_info=True)

    wrapped.__name__ = receiver.__name__
    return wrapped


def _ns(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1e9) if moment is not None else None


def on_run_creating(sender: Any, agent: str, carrier: dict[str, str], **kwargs: Any) -> None:
    span = tracer.start_span(
        f"chamvi.run {agent}", kind=SpanKind.INTERNAL, attributes={"gen_ai.agent.name": agent}
    )
    span.end()
    propagate.inject(carrier, context=trace.set_span_in_context(span))


def on_run_started(
    sender: Any, run: Run, resumed: bool, attempt: int, decision: Any = None, **kwargs: Any
) -> None:
    parent = propagate.extract(run.trace_context or {})
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": run.agent,
        "gen_ai.agent.version": run.agent_version,
        "chamvi.run.id": run.pk,
        "chamvi.attempt": attempt,
        "chamvi.resumed": resumed,
    }
    if run.thread:
        attributes["gen_ai.conversation.id"] = run.thread
    if run.parent_id:
        attributes["chamvi.parent_run.id"] = run.parent_id
    span = tracer.start_span(
        f"invoke_agent {run.agent}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes
    )
    if resumed:
        what = {"chamvi.after": decision.decision if decision is not None else "recovery"}
        if decision is not None:
            what["chamvi.tool.name"] = decision.tool_name
        span.add_event("chamvi.resumed", what)
    token = otel_context.attach(trace.set_span_in_context(span))
    with _lock:
        _executions[run.pk] = _Execution(span, token)


def on_run_delta(sender: Any, run_id: str, step: int, **kwargs: Any) -> None:
    with _lock:
        execution = _executions.get(run_id)
        if execution is not None and step not in execution.first_chunk:
            execution.first_chunk[step] = time.time_ns()


def on_step_saved(sender: Any, run_id: str, steps: list[Any], **kwargs: Any) -> None:
    with _lock:
        execution = _executions.get(run_id)
    if execution is None:
        return
    parent = trace.set_span_in_context(execution.span)
    content = conf.TRACE_CONTENT
    for step in steps:
        if step.kind == "llm":
            _model_call(step, parent, execution, content)
        elif step.kind == "tool":
            _tool_call(step, parent, content)


def _model_call(step: Any, parent: otel_context.Context, execution: _Execution, content: bool) -> None:
    output = step.output or {}
    usage = output.get("usage") or {}
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": step.name,
        "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
        "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
        "chamvi.step": step.index,
    }
    if output.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = [output["finish_reason"]]
    start = _ns(step.started_at)
    first = execution.first_chunk.pop(step.index, None)
    if first is not None and start is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = max(first - start, 0) / 1e9
    if content:
        answer = {"text": output.get("text"), "tool_calls": output.get("tool_calls")}
        attributes["gen_ai.output.messages"] = json.dumps(answer, default=str)
    span = tracer.start_span(
        f"chat {step.name}", context=parent, kind=SpanKind.CLIENT, attributes=attributes, start_time=start
    )
    if step.error:
        span.set_status(StatusCode.ERROR, step.error[:200])
    span.end(end_time=_ns(step.finished_at))


def _tool_call(step: Any, parent: otel_context.Context, content: bool) -> None:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": step.name,
        "chamvi.step": step.index,
        "chamvi.tool.outcome": "error" if step.error else "ok",
    }
    if content:
        attributes["gen_ai.tool.call.arguments"] = json.dumps(step.input, default=str)
        attributes["gen_ai.tool.call.result"] = json.dumps(step.output, default=str)
    span = tracer.start_span(
        f"execute_tool {step.name}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        start_time=_ns(step.started_at),
    )
    if step.error:
        span.set_status(StatusCode.ERROR, step.error[:200])
    span.end(end_time=_ns(step.finished_at))


def on_run_waiting(sender: Any, run: Run, waitpoint: Any, **kwargs: Any) -> None:
    with _lock:
        execution = _executions.get(run.pk)
    if execution is None:
        return
    # Never the wait point's token: it decides the approval without a session.
    execution.span.add_event(
        f"chamvi.{waitpoint.kind}",
        {"gen_ai.tool.name": waitpoint.tool_name, "chamvi.approval.id": waitpoint.approval_id},
    )


def on_execution_ended(sender: Any, run_id: str, status: str | None, **kwargs: Any) -> None:
    with _lock:
        execution = _executions.pop(run_id, None)
    if execution is None:
        return
    execution.span.set_attribute("chamvi.status", status or "claim_lost")
    if status in ("failed", None):
        execution.span.set_status(StatusCode.ERROR, "the run failed" if status else "the claim was lost")
    execution.span.end()
    try:
        otel_context.detach(execution.token)  # type: ignore[arg-type]
    except Exception:  # another thread's: the executing thread's context is its own to restore
        logger.debug("tracing: run %s's context was not this thread's", run_id)


def connect() -> None:
    """Trace what the engine signals (idempotent)."""
    for signal, receiver in (
        (signals.run_creating, on_run_creating),
        (signals.run_started, on_run_started),
        (signals.run_delta, on_run_delta),
        (signals.step_saved, on_step_saved),
        (signals.run_waiting, on_run_waiting),
        (signals.execution_ended, on_execution_ended),
    ):
        signal.connect(_safe(receiver), dispatch_uid=f"chamvi_runs.tracing.{receiver.__name__}", weak=False)
