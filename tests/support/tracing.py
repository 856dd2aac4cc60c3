"""OpenTelemetry's SDK for the tracing tests: in this process, an in-memory exporter; in a worker
process the tests start, the SDK's console exporter writing one JSON span per line to the file
``CHAMVI_TEST_TRACE_FILE`` names (``tests.testapp`` installs it when the variable is set)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE_FILE = "CHAMVI_TEST_TRACE_FILE"

_memory: InMemorySpanExporter | None = None


def in_memory() -> InMemorySpanExporter:
    """This process's exporter, installed once (a process has one tracer provider)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    global _memory
    if _memory is None:
        _memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        trace.set_tracer_provider(provider)
    return _memory


def to_file_if_asked() -> None:
    """In a worker process the tests start: its spans as JSON lines in ``$CHAMVI_TEST_TRACE_FILE``."""
    path = os.environ.get(TRACE_FILE)
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(path, "a", buffering=1)  # noqa: SIM115  (open for the life of the process)
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    trace.set_tracer_provider(provider)


def read(path: str) -> list[dict[str, Any]]:
    with open(path) as spans:
        return [json.loads(line) for line in spans if line.strip()]
