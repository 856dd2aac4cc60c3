"""``settings.CHAMVI_RUNS``, read lazily on every access so tests can override it.

One typed property per setting (like django-cors-headers' ``conf``): call sites get the type they
need. Values are validated by the system checks (``checks.py``), not here: a property converts,
it does not judge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "QUEUE": "chamvi",
    "EXECUTOR": "rq",
    "LEASE_SECONDS": 30,
    "HEARTBEAT_SECONDS": 10,
    "CANCEL_POLL_SECONDS": 1.0,
    "APPROVAL_TTL": timedelta(hours=24),
    "OPENAI": {},
    "POLICY": "chamvi_runs.policy.DefaultPolicy",
    "STREAM_BUFFER_SECONDS": 300,
    "STREAM_COALESCE_SECONDS": 0.005,
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    "MAX_INPUTS": 100,
    "MAX_PENDING_INPUT_BYTES": 1024 * 1024,
    "MODEL_BACKOFF_SECONDS": 0.5,
    "MAX_INVALID_TOOL_CALLS": 3,
    "MAX_ATTEMPTS": 5,
    "MAX_CHILD_DEPTH": 3,
    "VERSION_GRACE_SECONDS": 300,
    "TRACE_CONTENT": False,
    "CONCURRENCY": 1,
    "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
    "RESPONSES_MODEL": "chamvi_runs.llm_responses.ResponsesModel",
    "METRICS_PORT": None,
    "METRICS_ADDR": "127.0.0.1",
    "METRICS_TOKEN": None,
}

METRICS_KEYS = ("METRICS_PORT", "METRICS_ADDR", "METRICS_TOKEN")
"""The settings of ``chamvi_runs.metrics``, which needs prometheus-client (the ``metrics`` extra)."""

OPENAI_KEYS = frozenset({"api_key", "base_url", "timeout", "max_retries"})


class Conf:
    def _get(self, name: str) -> Any:
        value = getattr(settings, "CHAMVI_RUNS", {})
        user = value if isinstance(value, dict) else {}
        return user.get(name, DEFAULTS[name])

    @property
    def CONCURRENCY(self) -> int:
        """Runs one RQ worker process executes at once, each in a thread."""
        return int(self._get("CONCURRENCY"))

    @property
    def STREAM_COALESCE_SECONDS(self) -> float:
        """How long a delta waits for the next ones of its step, to go out merged with them."""
        return float(self._get("STREAM_COALESCE_SECONDS"))

    @property
    def QUEUE(self) -> str:
        """The RQ queue (in ``RQ_QUEUES``) that runs are enqueued on."""
        return str(self._get("QUEUE"))

    @property
    def EXECUTOR(self) -> str:
        """``"rq"`` (workers) or ``"thread"`` (embedded: this process executes)."""
        return str(self._get("EXECUTOR"))

    @property
    def LEASE_SECONDS(self) -> float:
        return float(self._get("LEASE_SECONDS"))

    @property
    def HEARTBEAT_SECONDS(self) -> float:
        return float(self._get("HEARTBEAT_SECONDS"))

    @property
    def CANCEL_POLL_SECONDS(self) -> float:
        return float(self._get("CANCEL_POLL_SECONDS"))

    @property
    def APPROVAL_TTL(self) -> timedelta:
        """A timedelta, or seconds."""
        value = self._get("APPROVAL_TTL")
        return value if isinstance(value, timedelta) else timedelta(seconds=value)

    @property
    def OPENAI(self) -> dict[str, Any]:
        """Keyword arguments of ``openai.OpenAI`` (``OPENAI_KEYS``)."""
        return dict(self._get("OPENAI"))

    @property
    def POLICY(self) -> str:
        """Dotted path of the policy class."""
        return str(self._get("POLICY"))

    @property
    def STREAM_BUFFER_SECONDS(self) -> float:
        return float(self._get("STREAM_BUFFER_SECONDS"))

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:
        return int(self._get("MAX_PAYLOAD_BYTES"))

    @property
    def MAX_INPUTS(self) -> int:
        """Steering inputs one run takes in its life; the next is refused (``too_many_inputs``)."""
        return int(self._get("MAX_INPUTS"))

    @property
    def MAX_PENDING_INPUT_BYTES(self) -> int:
        """Bytes of steering input (JSON) a run holds for its next model call; an input that would
        pass it is refused (``inputs_pending``) until the model call takes them."""
        return int(self._get("MAX_PENDING_INPUT_BYTES"))

    @property
    def MODEL_BACKOFF_SECONDS(self) -> float:
        return float(self._get("MODEL_BACKOFF_SECONDS"))

    @property
    def MAX_INVALID_TOOL_CALLS(self) -> int:
        return int(self._get("MAX_INVALID_TOOL_CALLS"))

    @property
    def MAX_ATTEMPTS(self) -> int:
        return int(self._get("MAX_ATTEMPTS"))

    @property
    def VERSION_GRACE_SECONDS(self) -> float:
        """How long after the last worker with an agent version was seen its waiting runs are moved
        on by the agent's ``on_version_change`` rule (SPEC §14)."""
        return float(self._get("VERSION_GRACE_SECONDS"))

    @property
    def TRACE_CONTENT(self) -> bool:
        """Whether OpenTelemetry spans carry message content (answers, tool arguments and results)."""
        return bool(self._get("TRACE_CONTENT"))

    @property
    def MAX_CHILD_DEPTH(self) -> int:
        return int(self._get("MAX_CHILD_DEPTH"))

    @property
    def MODEL(self) -> str:
        """Dotted path of the model class (``chamvi_runs.core.ports.Model``)."""
        return str(self._get("MODEL"))

    @property
    def RESPONSES_MODEL(self) -> str:
        """Dotted path of the model class of agents with ``model_api="responses"``."""
        return str(self._get("RESPONSES_MODEL"))

    @property
    def METRICS_PORT(self) -> int | None:
        """The port an RQ worker process serves its Prometheus metrics on; None: it serves none."""
        value = self._get("METRICS_PORT")
        return None if value is None else int(value)

    @property
    def METRICS_ADDR(self) -> str:
        """The address a worker's metrics port is bound to."""
        return str(self._get("METRICS_ADDR"))

    @property
    def METRICS_TOKEN(self) -> str | None:
        """A bearer token that lets a scraper read ``metrics.metrics_view`` (staff users may anyway)."""
        value = self._get("METRICS_TOKEN")
        return None if value is None else str(value)


conf = Conf()
