"""System checks for ``settings.CHAMVI_RUNS`` (a wrong value is an error naming the key), and for
the settings of other apps that chamvi_runs relies on.

=========  ==================================================================
id         problem
=========  ==================================================================
E001       ``CHAMVI_RUNS`` is not a dict
E002       ``QUEUE`` is not a non-empty string
E003       ``EXECUTOR`` is neither ``"rq"`` nor ``"thread"``
E004       ``LEASE_SECONDS`` is not a positive number
E005       ``HEARTBEAT_SECONDS`` is not a positive number
E006       ``CANCEL_POLL_SECONDS`` is not a positive number
E007       ``APPROVAL_TTL`` is not a positive timedelta or number of seconds
E008       ``OPENAI`` is not a dict, has unknown keys, or a key has a wrong value
E009       ``POLICY`` cannot be imported
E010       ``STREAM_BUFFER_SECONDS`` is not a positive number
E011       ``MAX_PAYLOAD_BYTES`` is not a positive int
E012       ``QUEUE`` is not in ``settings.RQ_QUEUES`` (``rq`` executor)
E013       ``MODEL`` cannot be imported
E014       ``MODEL_BACKOFF_SECONDS`` is not a positive number
E015       ``MAX_INVALID_TOOL_CALLS`` is not a positive int
E016       ``HEARTBEAT_SECONDS`` is more than half of ``LEASE_SECONDS``
E017       ``MAX_ATTEMPTS`` is not a positive int
E019       ``CONCURRENCY`` is not a positive int
E020       ``STREAM_COALESCE_SECONDS`` is not a number >= 0
E025       ``MAX_INPUTS`` is not a positive int
E026       ``MAX_PENDING_INPUT_BYTES`` is not a positive int, or is less than ``MAX_PAYLOAD_BYTES``
E028       ``MAX_CHILD_DEPTH`` is not a positive int
E029       ``VERSION_GRACE_SECONDS`` is not a number >= 0
E030       ``TRACE_CONTENT`` is not a bool
E031       ``RESPONSES_MODEL`` cannot be imported
W001       an unknown key in ``CHAMVI_RUNS`` (a typo?)
W002       ``RQ['WORKER_CLASS']`` is not ``chamvi_runs.worker.Worker`` (``rq`` executor)
E018       ``CHANNEL_LAYERS`` has no ``default`` layer: websockets and Server-Sent Events need one
W003       a channels-redis host of ``CHANNEL_LAYERS`` times reads out before twice the layer's
           blocking pop (redis-py 8: 5 s unless ``socket_timeout`` is set): idle sockets close, 1011
W004       ``EXECUTOR`` is ``"thread"`` but ``ASGI_APPLICATION`` does not start the embedded executor
           (runs would stay ``queued``)
W005       ``LOGIN_URL`` resolves to no view: the pages send anonymous visitors to a 404
W006       ``EXECUTOR`` is ``"rq"`` with a SQLite database: workers are other processes, and claims
           between processes are built and tested for PostgreSQL
=========  ==================================================================

The metrics settings (``METRICS_PORT``, ``METRICS_ADDR``, ``METRICS_TOKEN``) have checks of their
own, listed by ``check_metrics``.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, METRICS_KEYS, OPENAI_KEYS


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _error(key: str, message: str, id_: str, option: str | None = None) -> Error:
    name = f"CHAMVI_RUNS['{key}']" + (f"['{option}']" if option else "")
    return Error(f"{name} {message}", id=f"chamvi_runs.{id_}")


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    user = getattr(settings, "CHAMVI_RUNS", {})
    if not isinstance(user, dict):
        return [Error("CHAMVI_RUNS must be a dict", id="chamvi_runs.E001")]
    errors: list[Error | Warning] = []
    for key in sorted(set(user) - set(DEFAULTS), key=str):
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
        errors.append(
            _error(
                "HEARTBEAT_SECONDS",
                f"must be at most half of LEASE_SECONDS ({value['HEARTBEAT_SECONDS']!r} > "
                f"{value['LEASE_SECONDS']!r} / 2), or the lease expires between two heartbeats",
                "E016",
            )
        )
    ttl = value["APPROVAL_TTL"]
    if not ((isinstance(ttl, timedelta) and ttl > timedelta(0)) or _positive(ttl)):
        errors.append(_error("APPROVAL_TTL", "must be a positive timedelta or number of seconds", "E007"))
    openai = value["OPENAI"]
    if not isinstance(openai, dict):
        errors.append(_error("OPENAI", "must be a dict", "E008"))
    else:
        unknown = sorted(set(openai) - OPENAI_KEYS, key=str)
        if unknown:
            errors.append(
                _error("OPENAI", f"has unknown keys {unknown}; known: {sorted(OPENAI_KEYS)}", "E008")
            )
        for option in ("api_key", "base_url"):
            if openai.get(option) is not None and not isinstance(openai[option], str):
                errors.append(_error("OPENAI", "must be a string", "E008", option))
        retries = openai.get("max_retries", 0)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            errors.append(_error("OPENAI", f"must be an int >= 0, not {retries!r}", "E008", "max_retries"))
        if "timeout" in openai and not _positive(openai["timeout"]):
            errors.append(
                _error("OPENAI", f"must be a positive number, not {openai['timeout']!r}", "E008", "timeout")
            )
    for key, id_ in (("POLICY", "E009"), ("MODEL", "E013"), ("RESPONSES_MODEL", "E031")):
        if not isinstance(value[key], str):
            errors.append(_error(key, f"must be a dotted import path, not {value[key]!r}", id_))
            continue
        try:
            import_string(value[key])
        except Exception as exc:  # an import that fails in any way is this setting's error, not a crash
            errors.append(_error(key, f"cannot be imported: {type(exc).__name__}: {exc}", id_))
    if not isinstance(value["TRACE_CONTENT"], bool):
        errors.append(
            _error("TRACE_CONTENT", f"must be True or False, not {value['TRACE_CONTENT']!r}", "E030")
        )
    for key, id_ in (("STREAM_COALESCE_SECONDS", "E020"), ("VERSION_GRACE_SECONDS", "E029")):
        seconds = value[key]
        if not (_positive(seconds) or (seconds == 0 and not isinstance(seconds, bool))):
            errors.append(_error(key, f"must be a number >= 0, not {seconds!r}", id_))
    limit = value["MAX_PAYLOAD_BYTES"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        errors.append(_error("MAX_PAYLOAD_BYTES", "must be a positive int", "E011"))
    pending = value["MAX_PENDING_INPUT_BYTES"]
    if not isinstance(pending, int) or isinstance(pending, bool) or pending < 1:
        errors.append(_error("MAX_PENDING_INPUT_BYTES", f"must be a positive int, not {pending!r}", "E026"))
    elif isinstance(limit, int) and not isinstance(limit, bool) and pending < limit:
        errors.append(
            _error(
                "MAX_PENDING_INPUT_BYTES",
                f"({pending}) must be at least MAX_PAYLOAD_BYTES ({limit}): no input that size could be sent",
                "E026",
            )
        )
    for key, id_ in (
        ("MAX_INVALID_TOOL_CALLS", "E015"),
        ("MAX_ATTEMPTS", "E017"),
        ("CONCURRENCY", "E019"),
        ("MAX_INPUTS", "E025"),
        ("MAX_CHILD_DEPTH", "E028"),
    ):
        count = value[key]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            errors.append(_error(key, f"must be a positive int, not {count!r}", id_))
    if value["EXECUTOR"] == "rq" and isinstance(value["QUEUE"], str):
        queues = getattr(settings, "RQ_QUEUES", None)
        if not isinstance(queues, dict) or value["QUEUE"] not in queues:
            errors.append(
                _error("QUEUE", f"names {value['QUEUE']!r}, which is not in settings.RQ_QUEUES", "E012")
            )
        rq_settings = getattr(settings, "RQ", None)
        worker = rq_settings.get("WORKER_CLASS") if isinstance(rq_settings, dict) else None
        if worker != "chamvi_runs.worker.Worker":
            errors.append(
                Warning(
                    "RQ['WORKER_CLASS'] should be 'chamvi_runs.worker.Worker' so that workers use the JSON "
                    "serializer, drain on SIGTERM and keep the lease keeper in-process",
                    id="chamvi_runs.W002",
                )
            )
    return errors


@register(Tags.compatibility)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The settings of ``chamvi_runs.metrics``:

    =========  ==============================================================
    E021       ``METRICS_PORT`` is neither None nor an int from 0 to 65535
    E022       ``METRICS_ADDR`` is not a non-empty string
    E023       ``METRICS_TOKEN`` is neither None nor a non-empty string
    E024       ``METRICS_PORT`` or ``METRICS_TOKEN`` is set, but prometheus-client is not
               installed (the ``metrics`` extra)
    =========  ==============================================================
    """
    user = getattr(settings, "CHAMVI_RUNS", {})
    if not isinstance(user, dict):
        return []  # E001, from check_settings
    value = {**{key: DEFAULTS[key] for key in METRICS_KEYS}, **user}
    errors = []
    port = value["METRICS_PORT"]
    if port is not None and not (isinstance(port, int) and not isinstance(port, bool) and 0 <= port <= 65535):
        errors.append(
            _error("METRICS_PORT", f"must be None or a port number (0-65535), not {port!r}", "E021")
        )
    addr = value["METRICS_ADDR"]
    if not isinstance(addr, str) or not addr:
        errors.append(_error("METRICS_ADDR", f"must be a non-empty string, not {addr!r}", "E022"))
    token = value["METRICS_TOKEN"]
    if token is not None and (not isinstance(token, str) or not token):
        errors.append(_error("METRICS_TOKEN", "must be None or a non-empty string", "E023"))
    wanted = [key for key in ("METRICS_PORT", "METRICS_TOKEN") if value[key] is not None]
    if wanted and importlib.util.find_spec("prometheus_client") is None:
        errors.append(
            Error(
                f"CHAMVI_RUNS['{wanted[0]}'] is set, but prometheus-client is not installed: "
                "chamvi_runs cannot export metrics without it",
                # chamvi-runs is on no package index: the extra comes with a checkout or a wheel.
                hint="pip install 'prometheus-client>=0.20', or chamvi-runs[metrics] from your checkout: "
                "pip install '/path/to/chamvi_runs[metrics]' (or a wheel built from it: "
                "pip wheel --no-deps /path/to/chamvi_runs, then "
                "pip install './chamvi_runs-<version>-py3-none-any.whl[metrics]').",
                id="chamvi_runs.E024",
            )
        )
    return errors


@register(Tags.compatibility)
def check_channel_layers(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W003: a channels-redis layer waits for messages with a blocking pop of ``brpop_timeout``
    seconds; a Redis client whose socket read times out first raises TimeoutError in the consumer of
    every socket that has been idle that long. Twice the pop leaves room for a slow network or loop."""
    try:
        from channels_redis.core import RedisChannelLayer
    except ImportError:
        return []
    warnings = []
    for alias, layer in (getattr(settings, "CHANNEL_LAYERS", None) or {}).items():
        try:
            backend = import_string(layer["BACKEND"])
            if not (isinstance(backend, type) and issubclass(backend, RedisChannelLayer)):
                continue
            instance = backend(**layer.get("CONFIG", {}))
            # The timeout a connection of each host really gets: from its options, its URL's query
            # or the installed redis-py's default. No connection is opened.
            pools = [instance.create_pool(index) for index in range(instance.ring_size)]
            timeouts = [pool.make_connection().socket_timeout for pool in pools]
        except Exception:  # a layer channels cannot build either: channels reports it when used
            continue
        pop = instance.brpop_timeout
        short = [t for t in timeouts if t is not None and t < 2 * pop]
        if short:
            warnings.append(
                Warning(
                    f"CHANNEL_LAYERS['{alias}'] reads from Redis with a {min(short):g} s socket timeout, "
                    f"shorter than twice the layer's {pop:g} s blocking pop: every websocket idle for "
                    f"{min(short):g} s is closed with 1011",
                    hint="Give each host a longer read timeout, e.g. "
                    '"hosts": [{"address": REDIS_URL, "socket_timeout": 30}].',
                    id="chamvi_runs.W003",
                )
            )
    return warnings


@register(Tags.compatibility)
def check_channel_layer_exists(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """E018: without a default layer every websocket fails at connect and the page reconnects forever."""
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    if isinstance(layers, dict) and "default" in layers:
        return []
    return [
        Error(
            "CHANNEL_LAYERS has no 'default' layer: chamvi_runs streams run events through it "
            "(websockets and Server-Sent Events)",
            hint='Embedded mode: CHANNEL_LAYERS = {"default": {"BACKEND": '
            '"channels.layers.InMemoryChannelLayer"}}; with Redis: channels_redis.core.RedisChannelLayer.',
            id="chamvi_runs.E018",
        )
    ]


@register(Tags.compatibility)
def check_executor_runs_somewhere(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W004 and W006: where runs execute must exist. With the ``thread`` executor that is the ASGI
    process, which must start it; with ``rq`` it is other processes, which need PostgreSQL."""
    executor = _executor()
    if executor == "rq":
        from django.db import router

        from .models import Run

        if settings.DATABASES[router.db_for_write(Run)].get("ENGINE", "").endswith("sqlite3"):
            return [
                Warning(
                    "CHAMVI_RUNS['EXECUTOR'] is 'rq' with a SQLite database: RQ workers claim runs from "
                    "other processes, which chamvi_runs supports on PostgreSQL",
                    hint='Use PostgreSQL for the RQ executor, or CHAMVI_RUNS["EXECUTOR"] = "thread" '
                    "to execute runs inside the web process (embedded mode).",
                    id="chamvi_runs.W006",
                )
            ]
        return []
    if executor != "thread" or _asgi_starts_embedded():
        return []
    return [
        Warning(
            "CHAMVI_RUNS['EXECUTOR'] is 'thread' but settings.ASGI_APPLICATION does not start the "
            "embedded executor: runs would stay 'queued'",
            hint="In asgi.py: from chamvi_runs.asgi import get_asgi_application; "
            "application = get_asgi_application() (or call chamvi_runs.asgi.start_embedded()).",
            id="chamvi_runs.W004",
        )
    ]


def _executor() -> Any:
    user = getattr(settings, "CHAMVI_RUNS", {})
    return (user if isinstance(user, dict) else {}).get("EXECUTOR", DEFAULTS["EXECUTOR"])


def _asgi_starts_embedded() -> bool:
    """Import the ASGI application (without starting threads) and see whether it asked to start."""
    from .runtime import embedded

    path = getattr(settings, "ASGI_APPLICATION", None)
    if not path:
        return False
    module = path.rpartition(".")[0]
    fresh = module not in sys.modules
    with embedded.inspecting():
        try:
            import_string(path)
        except Exception:  # an application that cannot be imported: the server reports that itself
            return True
        finally:
            if fresh:
                # The server imports it again and starts the executor then (runserver checks first).
                sys.modules.pop(module, None)
    return embedded.embedded_requested()


@register(Tags.urls)
def check_login_url(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W005: the pages are ``login_required``; Django's default ``/accounts/login/`` is a 404 in a new
    site that has only the admin's login."""
    from django.shortcuts import resolve_url
    from django.urls import NoReverseMatch, Resolver404, get_script_prefix, resolve

    shown = settings.LOGIN_URL if isinstance(settings.LOGIN_URL, str) else type(settings.LOGIN_URL).__name__
    try:
        url = str(resolve_url(settings.LOGIN_URL))
    except (NoReverseMatch, TypeError, ValueError):
        pass  # a URL name no pattern has (lazy or not), or no URL at all
    else:
        if "://" in url or url.startswith("//") or not url.startswith("/"):
            return []  # another host, or a relative URL: nothing this site can check
        path, prefix = url.split("?", 1)[0], get_script_prefix()
        try:
            resolve(path[len(prefix) - 1 :] if path.startswith(prefix) else path)
            return []
        except Resolver404:
            pass
    return [
        Warning(
            f"settings.LOGIN_URL ({shown!r}) resolves to no view: the chamvi_runs pages "
            "redirect anonymous visitors there",
            hint="Point it at your site's login view; a brand-new site without one can use the admin's, "
            'LOGIN_URL = "admin:login", which lets staff users in only.',
            id="chamvi_runs.W005",
        )
    ]
