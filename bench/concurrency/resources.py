"""The bench's own database and Redis db (created, migrated, emptied) and the workers' environment.
Nothing here touches another database than ``DATABASE`` or another Redis db than ``REDIS_DB``."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import redis

from bench.common import ROOT, databases

DATABASE = "chamvi_conc_bench"
REDIS_DB = 8
APP_NAME = "chamvi-bench-conc"
SETTINGS = "bench.common.settings"

SERVER = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"


def database_url(pool: int | None = None, app: str = APP_NAME) -> str:
    query = f"application_name={app}" + (f"&pool={pool}" if pool else "")
    return f"{SERVER}/{DATABASE}?{query}"


def admin() -> psycopg.Connection:
    """A connection to the server's ``postgres`` database, outside everything measured."""
    return psycopg.connect(f"{SERVER}/postgres?application_name=chamvi-bench-conc-admin", autocommit=True)


def ensure_database() -> None:
    databases.create_missing(SERVER, DATABASE)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(app="chamvi-bench-conc-migrate"),
        "REDIS_URL": REDIS_URL,
        "OPENAI_API_KEY": "bench",
    }
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "migrate",
            "--run-syncdb",
            "--no-input",
            "-v",
            "0",
            f"--settings={SETTINGS}",
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )


def flush_redis() -> None:
    redis.Redis.from_url(REDIS_URL).flushdb()


def max_connections() -> int:
    with admin() as conn:
        row = conn.execute("SHOW max_connections").fetchone()
        assert row is not None
        return int(row[0])


def worker_env(database_url: str, model_url: str, concurrency: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        DATABASE_URL=database_url,
        REDIS_URL=REDIS_URL,
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="bench",
        CHAMVI_CONCURRENCY=str(concurrency),
        PYTHONUNBUFFERED="1",
    )
    return env
