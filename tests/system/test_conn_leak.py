"""What system check E027 asks of a site holds under a real daphne: with ``CONN_MAX_AGE = 0``, or
with Django's pool, page loads leave no pile of idle PostgreSQL connections behind
(bench/conn_leak/, whose ``persistent`` setting shows the pile; not run here, where it would
take connections from the other tests on this server)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.conftest import require

LOADS = 60


@pytest.mark.timeout(120)
def test_daphne_holds_connections_bounded_with_the_fix() -> None:
    require("DATABASE_URL")
    require("REDIS_URL")
    from bench.conn_leak import Server, measure, prepare

    database = f"{urlsplit(os.environ['DATABASE_URL']).path.lstrip('/')}_connleak"
    server = Server()
    prepare(server, database)
    try:
        per_request = measure(server, database, "per-request", LOADS)
        pooled = measure(server, database, "pool", LOADS)
    finally:
        server.admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    # The connection of the request just answered, at most, and one of the request before that may
    # not have left pg_stat_activity yet (a backend exits a moment after its client closes). The
    # pool keeps at most its max_size (4). bench/conn_leak/: 10 to 21 with CONN_MAX_AGE = 500.
    assert per_request.peak <= 2 and per_request.held <= 1, per_request
    assert pooled.peak <= 4 and pooled.held <= 4, pooled
