"""System checks for ``settings.CHAMVI_RUNS``: a wrong value is an error naming the key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, OPENAI_KEYS


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _error(key: str, message: str, id_: str) -> Error:
    return Error(f"CHAMVI_RUNS['{key}'] {message}", id=f"chamvi_runs.{id_}")


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    user = getattr(settings, "CHAMVI_RUNS", {})
    if not isinstance(user, dict):
        return [Error("CHAMVI_RUNS must be a dict", id="chamvi_runs.E001")]
    errors: list[Error | Warning] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(Warning(f"CHAMVI_RUNS['{key}'] is not a known setting", id="chamvi_runs.W001"))
    value = {**DEFAULTS, **user}
    if not isinstance(value["QUEUE"], str) or not value["QUEUE"]:
        errors.append(_error("QUEUE", "must be a non-empty string", "E002"))
    if value["EXECUTOR"] not in ("rq", "thread"):
        errors.append(_error("EXECUTOR", f"must be 'rq' or 'thread', not {value['EXECUTOR']!r}", "E003"))
    for key, id_ in (
        ("LEASE_SECONDS", "E004"),
        ("HEARTBEAT_SECONDS", "E005"),
        ("CANCEL_POLL_SECONDS", "E006"),
        ("STREAM_BUFFER_SECONDS", "E010"),
        ("MODEL_BACKOFF_SECONDS", "E014"),
    ):
        if not _positive(value[key]):
            errors.append(_error(key, f"must be a positive number, not {value[key]!r}", id_))
    if (
        _positive(value["LEASE_SECONDS"])
        and _positive(value["HEARTBEAT_SECONDS"])
        and value["HEARTBEAT_SECONDS"] * 2 > value["LEASE_SECONDS"]
    ):
        errors.append(_error("HEARTBEAT_SECONDS", "must be at most half of LEASE_SECONDS", "E005"))
    ttl = value["APPROVAL_TTL"]
    if not ((isinstance(ttl, timedelta) and ttl > timedelta(0)) or _positive(ttl)):
        errors.append(_error("APPROVAL_TTL", "must be a positive timedelta or number of seconds", "E007"))
    openai = value["OPENAI"]
    if not isinstance(openai, dict):
        errors.append(_error("OPENAI", "must be a dict", "E008"))
    else:
        unknown = sorted(set(openai) - OPENAI_KEYS)
        if unknown:
            errors.append(
                _error("OPENAI", f"has unknown keys {unknown}; known: {sorted(OPENAI_KEYS)}", "E008")
            )
        if "max_retries" in openai and (
            not isinstance(openai["max_retries"], int) or openai["max_retries"] < 0
        ):
            errors.append(_error("OPENAI", "['max_retries'] must be an int >= 0", "E008"))
        if "timeout" in openai and not _positive(openai["timeout"]):
            errors.append(_error("OPENAI", "['timeout'] must be a positive number", "E008"))
    for key, id_ in (("POLICY", "E009"), ("MODEL", "E013")):
        try:
            import_string(value[key])
        except (ImportError, TypeError, ValueError) as exc:
            errors.append(_error(key, f"cannot be imported: {exc}", id_))
    limit = value["MAX_PAYLOAD_BYTES"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        errors.append(_error("MAX_PAYLOAD_BYTES", "must be a positive int", "E011"))
    invalid = value["MAX_INVALID_TOOL_CALLS"]
    if not isinstance(invalid, int) or isinstance(invalid, bool) or invalid < 1:
        errors.append(_error("MAX_INVALID_TOOL_CALLS", "must be a positive int", "E015"))
    if value["EXECUTOR"] == "rq" and isinstance(value["QUEUE"], str):
        queues = getattr(settings, "RQ_QUEUES", {})
        if value["QUEUE"] not in queues:
            errors.append(
                _error("QUEUE", f"names {value['QUEUE']!r}, which is not in settings.RQ_QUEUES", "E012")
            )
        worker = getattr(settings, "RQ", {}).get("WORKER_CLASS")
        if worker != "chamvi_runs.worker.Worker":
            errors.append(
                Warning(
                    "RQ['WORKER_CLASS'] should be 'chamvi_runs.worker.Worker' so that workers use the JSON "
                    "serializer, drain on SIGTERM and keep the lease keeper in-process",
                    id="chamvi_runs.W002",
                )
            )
    return errors
