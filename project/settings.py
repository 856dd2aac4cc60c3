"""The bundled project: configured only by environment variables, each optional (SPEC §10).

Unset REDIS_URL means embedded mode: in-memory channel layer and the in-process ``thread`` executor.
A site that wants its own agents imports this module and appends its app to INSTALLED_APPS.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def database_from_url(url: str) -> dict:
    """``postgres://user:pass@host:port/name?option=value`` or ``sqlite:///path`` as a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "postgres",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": _postgres_options(dict(parse_qsl(parts.query))),
            # Django under ASGI serves each request's sync code in a thread of its own: a persistent
            # connection would outlive it, one per request, until PostgreSQL runs out. Health checks
            # let long-lived workers survive a database restart.
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": True,
        }
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if path.startswith("//") or path.startswith("/"):  # sqlite:////abs/path
            path = path[1:]
        return _sqlite(path or str(BASE_DIR / "db.sqlite3"))
    raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (use postgres:// or sqlite:///)")


def _postgres_options(options: dict) -> dict:
    """``?pool=N``: Django's connection pool of at most N connections per process (psycopg_pool).
    A worker at ``CHAMVI_CONCURRENCY`` above a few needs one: its threads hand their connection
    back while their runs wait on the model. With ``CONN_HEALTH_CHECKS`` Django has the pool check
    a connection before handing it out, so a database restart costs no run."""
    if "pool" in options:
        size = int(options.pop("pool"))
        if size > 0:
            options["pool"] = {
                "min_size": 1,
                "max_size": size,
                "timeout": 30,
            }
    return options


def _sqlite(name: str) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        # Writers take the lock when their transaction begins, so the claim's read and conditional
        # write cannot interleave with another thread's (the embedded executor is threaded).
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL;",
        },
    }


DEMO_SECRET_KEY = "chamvi-demo-insecure-secret-key-change-me"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", DEMO_SECRET_KEY)
DEBUG = _flag("DJANGO_DEBUG", True)
if not DEBUG and SECRET_KEY == DEMO_SECRET_KEY:
    # Sessions, CSRF tokens and password resets are signed with it: a deployment must set its own.
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("DJANGO_DEBUG=0 needs DJANGO_SECRET_KEY: the demo's key is public")
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_rq",
    "chamvi_runs",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "project.csp.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = None
ASGI_APPLICATION = "project.asgi.application"

DATABASES = {
    "default": database_from_url(os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub: a group send is one PUBLISH, and a web process reads every message of
            # its groups from one subscription (the list-based core layer takes one blocking pop per
            # message). Measured with bench/stream_latency/: 3 times less daphne CPU per event and
            # 10 times lower latency at 20 concurrent streams. Pub/sub keeps nothing for a socket
            # that is away; the consumers fill any gap from the replay buffer (docs/streaming.md).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}]},
        }
    }
    RQ_QUEUES = {
        "chamvi": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": -1, "SERIALIZER": "rq.serializers.JSONSerializer"}
    }
    EXECUTOR = "rq"
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    RQ_QUEUES = {}
    EXECUTOR = "thread"
RQ = {"WORKER_CLASS": "chamvi_runs.worker.Worker"}

OPENAI_API_KEY = os.environ.get("OPENAI_API_KEY", "")
CHAMVI_RUNS = {
    "EXECUTOR": EXECUTOR,
    # Runs one worker process executes at once (an extension of SPEC §10's variables).
    "CONCURRENCY": int(os.environ.get("CHAMVI_CONCURRENCY", "1")),
    "OPENAI": {
        k: v
        for k, v in {"api_key": OPENAI_API_KEY, "base_url": os.environ.get("OPENAI_BASE_URL")}.items()
        if v
    },
}
if not OPENAI_API_KEY:
    # No key: the demo agents talk to an offline scripted model instead of a real endpoint.
    CHAMVI_RUNS["MODEL"] = "project.demo.offline.OfflineDemoModel"
    CHAMVI_RUNS["RESPONSES_MODEL"] = "project.demo.offline.OfflineDemoModel"
# Prometheus (the ``metrics`` extra): a worker's own port, where it binds, and a scraper's token for
# the /metrics view (docs/operations.md, "Metrics").
if os.environ.get("CHAMVI_METRICS_PORT"):
    CHAMVI_RUNS["METRICS_PORT"] = int(os.environ["CHAMVI_METRICS_PORT"])
if os.environ.get("CHAMVI_METRICS_ADDR"):
    CHAMVI_RUNS["METRICS_ADDR"] = os.environ["CHAMVI_METRICS_ADDR"]
if os.environ.get("CHAMVI_METRICS_TOKEN"):
    CHAMVI_RUNS["METRICS_TOKEN"] = os.environ["CHAMVI_METRICS_TOKEN"]
CHAMVI_MODEL = os.environ.get("CHAMVI_MODEL", "gpt-4o-mini")

AUTH_PASSWORD_VALIDATORS: list[dict] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# The demo's own scripts (its home page, the example chat page of docs/chat-client.md).
STATICFILES_DIRS = [BASE_DIR / "project" / "static"]
MEDIA_ROOT = BASE_DIR / "media"
LOGIN_URL = "/admin/login/"

# Every record names the run it was logged for (empty outside a run); CHAMVI_LOG_JSON=1 writes one
# JSON object per line instead of text (chamvi_runs.logs).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"run": {"()": "chamvi_runs.logs.RunContextFilter"}},
    "formatters": {
        "text": {"format": "%(levelname)s %(name)s run=%(run_id)s attempt=%(attempt)s %(message)s"},
        "json": {"()": "chamvi_runs.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["run"],
            "formatter": "json" if _flag("CHAMVI_LOG_JSON", False) else "text",
        }
    },
    "loggers": {
        "chamvi_runs": {"handlers": ["console"], "level": os.environ.get("CHAMVI_LOG_LEVEL", "INFO")}
    },
}
