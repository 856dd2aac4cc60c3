"""What the bench reads from PostgreSQL about one system's database: its commits, the CPU of its
backends, the bytes its tables hold. Everything is read from outside the system's own connections:
commits from a connection to the ``postgres`` database, so that reading them adds none."""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.common.procstat import cpu_ms_of


def server_url() -> str:
    """The PostgreSQL server of the tests' convention (DATABASE_URL), whatever database it names."""
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chamvi")


def dsn(database: str) -> str:
    parts = urlsplit(server_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


class Server:
    def __init__(self) -> None:
        self.admin = psycopg.connect(dsn("postgres"), autocommit=True)

    def version(self) -> str:
        return str(self.admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]

    def recreate(self, database: str) -> None:
        self.admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self.admin.execute(f'CREATE DATABASE "{database}"')

    def commits(self, database: str) -> int:
        row = self.admin.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database]
        ).fetchone()
        return int(row[0]) if row else 0

    def backend_pids(self, database: str) -> list[int]:
        rows = self.admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database])
        return [int(pid) for (pid,) in rows]

    def backend_cpu(self, database: str) -> dict[int, float]:
        """CPU ms of each backend now serving ``database`` (they run on this machine: /proc)."""
        return cpu_ms_of(self.backend_pids(database))

    def wait_for_no_backends(self, database: str, timeout: float = 15) -> None:
        """Until every backend of ``database`` has exited: a backend flushes its statistics at exit,
        while an idle one may hold them back for up to 10 s."""
        deadline = time.monotonic() + timeout
        while self.backend_pids(database) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stored(self, database: str) -> tuple[int, int]:
        """(bytes of the live rows of every table, bytes on disk of every table with its indexes
        and TOAST) in ``database``'s own schemas."""
        with psycopg.connect(dsn(database), autocommit=True) as conn:
            tables = conn.execute(
                "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p')"
                " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                " AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchall()
            live = disk = 0
            for (table,) in tables:
                row = conn.execute(
                    f"SELECT coalesce(sum(pg_column_size(t.*)), 0), pg_total_relation_size('{table}')"
                    f" FROM {table} t"
                ).fetchone()
                live += int(row[0])  # type: ignore[index]
                disk += int(row[1])  # type: ignore[index]
        self.wait_for_no_backends(database)
        return live, disk

    def close(self) -> None:
        self.admin.close()
