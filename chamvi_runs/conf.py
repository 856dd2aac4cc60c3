"""``settings.CHAMVI_RUNS``, read lazily on every access so tests can override it."""

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
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    "MODEL_BACKOFF_SECONDS": 0.5,
    "MAX_INVALID_TOOL_CALLS": 3,
    "MAX_ATTEMPTS": 5,
    "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
}

OPENAI_KEYS = frozenset({"api_key", "base_url", "timeout", "max_retries"})


class Conf:
    def _user(self) -> dict[str, Any]:
        value = getattr(settings, "CHAMVI_RUNS", {})
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(name)
        return self._user().get(name, DEFAULTS[name])

    @property
    def approval_ttl(self) -> timedelta:
        value = self.APPROVAL_TTL
        return value if isinstance(value, timedelta) else timedelta(seconds=value)


conf = Conf()
