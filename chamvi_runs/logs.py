"""Logging for sites: a filter that names the run behind every record, and a JSON formatter.

``RunContextFilter`` sets ``run_id``, ``attempt`` and ``worker`` (the claim's owner) on every
record it sees, from the execution the emitting thread works for (``core.log_context``); outside
an execution they are empty strings, so a text format such as
``"%(levelname)s %(name)s run=%(run_id)s attempt=%(attempt)s %(message)s"`` works for every
record. Attach it to a handler (not a logger): a handler's filters see the records of every
logger below the one it serves, tools' and libraries' included.

``JsonFormatter`` writes one JSON object per line: ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger``, ``message``, ``run_id``, ``attempt``, ``worker`` (null outside a run) and
``exc`` (the formatted traceback, or null)::

    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"run": {"()": "chamvi_runs.logs.RunContextFilter"}},
        "formatters": {"json": {"()": "chamvi_runs.logs.JsonFormatter"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "filters": ["run"], "formatter": "json"}
        },
        "loggers": {"chamvi_runs": {"handlers": ["console"], "level": "INFO"}},
    }
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from .core import log_context

FIELDS = ("run_id", "attempt", "worker")


class RunContextFilter(logging.Filter):
    """Adds ``run_id``, ``attempt`` and ``worker`` to every record; lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run_id"):  # set already by another handler's filter, or by ``extra``
            context = log_context.current()
            record.run_id = context.run_id if context else ""
            record.attempt = context.attempt if context else ""
            record.worker = context.worker if context else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (tracebacks' newlines are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "run_id"):
            # A handler without the filter: records are formatted in the thread that emitted them.
            RunContextFilter().filter(record)
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            payload[name] = getattr(record, name, "") or None
        parts = [
            self.formatException(record.exc_info) if record.exc_info else record.exc_text,
            self.formatStack(record.stack_info) if record.stack_info else None,
        ]
        payload["exc"] = "\n".join(part for part in parts if part) or None
        return json.dumps(payload, ensure_ascii=False, default=str)
