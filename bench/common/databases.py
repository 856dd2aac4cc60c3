"""A bench's own PostgreSQL database, made and dropped from the server's ``postgres`` database.
``server`` is a URL without a database (``postgres://postgres@127.0.0.1:5432``)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg


def split(url: str) -> tuple[str, str]:
    """``url``'s server and database name."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", "")), parts.path.lstrip("/")


def _admin(server: str) -> psycopg.Connection:
    return psycopg.connect(f"{server}/postgres", autocommit=True)


def create_missing(server: str, name: str) -> None:
    """``name`` as it is, or new and empty."""
    with _admin(server) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def recreate(server: str, name: str) -> None:
    """``name`` new and empty, whoever was connected to it."""
    with _admin(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop(server: str, name: str) -> None:
    with _admin(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
