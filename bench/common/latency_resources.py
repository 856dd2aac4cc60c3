"""The database (``chamvi_lat_*``) and Redis db (10) of the latency benches, bench.stream_latency and
bench.recovery, and the environment of their processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

from bench.common import ROOT, databases

PG = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/10"
SETTINGS = "bench.common.settings"
LOCK = "chamvi_lat:bench"


def env(database: str, model_port: int, **extra: str) -> dict[str, str]:
    base = dict(os.environ)
    base.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        # DEBUG on, the project's default: the figures of docs/performance.md were measured so, and
        # new ones stay comparable with them.
        DJANGO_DEBUG="1",
        DATABASE_URL=f"{PG}/{database}",
        REDIS_URL=REDIS_URL,
        OPENAI_BASE_URL=f"http://127.0.0.1:{model_port}/v1",
        OPENAI_API_KEY="bench",
        PYTHONUNBUFFERED="1",
        CHAMVI_LOG_LEVEL="WARNING",
        **extra,
    )
    return base


def take_redis(owner: str) -> None:
    """Both benches use Redis db 10 and its queue ``chamvi``: one bench at a time (a worker of one
    would take the other's jobs). A lock left by a process that died is taken over."""
    client = redis.Redis.from_url(REDIS_URL)
    held = client.get(LOCK)
    if held and Path(f"/proc/{int(held.split(b':')[0])}").exists():
        raise SystemExit(f"another latency bench holds Redis db 10: {held.decode()}")
    client.set(LOCK, f"{os.getpid()}:{owner}")


def release_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    if (client.get(LOCK) or b"").split(b":")[0] == str(os.getpid()).encode():
        client.delete(LOCK)


def fresh_database(name: str) -> None:
    """Drop and create ``name`` (a ``chamvi_lat_`` database), flush Redis db 10, migrate."""
    assert name.startswith("chamvi_lat_"), name
    take_redis(name)
    databases.recreate(PG, name)
    client = redis.Redis.from_url(REDIS_URL)
    lock = client.get(LOCK)
    client.flushdb()
    client.set(LOCK, lock or b"")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--run-syncdb", "-v0", f"--settings={SETTINGS}"],
        cwd=ROOT,
        env=env(name, 0),
        check=True,
    )


def drop_database(name: str) -> None:
    assert name.startswith("chamvi_lat_"), name
    release_redis()
    databases.drop(PG, name)
