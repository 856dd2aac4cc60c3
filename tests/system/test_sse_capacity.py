"""SSE clients hold no database connection while they wait: 60 concurrent streams of one real daphne
process, whose PostgreSQL role may open only 10 connections, all get their runs' events through
``run.end`` from a real RQ worker, and none gets an error."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from chamvi_runs import start_run
from chamvi_runs.models import Run
from chamvi_runs.web.auth import create_token
from tests.support.helpers import events, make_user
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, delay, finish, text
from tests.support.sse_helpers import parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

RUNS = 12
CLIENTS_PER_RUN = 5
CONNECTION_LIMIT = 10


@pytest.fixture
def limited_role() -> Iterator[str]:
    """A login role of this test database allowed CONNECTION_LIMIT connections (superusers are not
    limited, so it is not one): only the web process uses it, the shared server keeps its own."""
    role = f"{connection.settings_dict['NAME']}_sse"[:63]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone() is None:
            cursor.execute(f'CREATE ROLE "{role}" LOGIN')
        cursor.execute(f'ALTER ROLE "{role}" NOSUPERUSER CONNECTION LIMIT {CONNECTION_LIMIT}')
        for kind in ("TABLES", "SEQUENCES"):
            cursor.execute(f'GRANT ALL ON ALL {kind} IN SCHEMA public TO "{role}"')
    yield role
    with connection.cursor() as cursor:
        for kind in ("TABLES", "SEQUENCES"):
            cursor.execute(f'REVOKE ALL ON ALL {kind} IN SCHEMA public FROM "{role}"')
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')


class SseClient(threading.Thread):
    """One ``EventSource``: reads a run's stream until ``run.end``."""

    def __init__(self, port: int, run_id: str, token: str) -> None:
        super().__init__(daemon=True)
        self.port, self.run_id, self.token = port, run_id, token
        self.opened = threading.Event()
        self.status = 0
        self.error = ""
        self.events: list[dict[str, Any]] = []

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
            conn.request("GET", f"/chamvi/api/runs/{self.run_id}/stream/", headers=headers)
            response = conn.getresponse()
            self.status = response.status
            if response.status != 200:
                self.error = response.read().decode(errors="replace")
                return
            pending = ""
            while not self.events or self.events[-1]["type"] != "run.end":
                chunk = response.read1(65536).decode()
                if not chunk:
                    self.error = "the stream ended before run.end"
                    return
                pending += chunk
                if pending.startswith(": open\n\n"):
                    self.opened.set()
                frames, _, pending = pending.rpartition("\n\n")
                self.events += parse(frames + "\n\n") if frames else []
            conn.close()
        except Exception as exc:  # reported by the test, with the others
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.opened.set()


def _role_connections(role: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role])
        return cursor.fetchone()[0]


def test_sixty_sse_clients_of_one_web_process_need_no_database_connection_while_they_wait(
    server, limited_role
):
    user = make_user("watcher")
    _, token = create_token(user, "sse")
    server.script(
        "m-basic",
        [Reply(text(f"run {n} "), delay(0.05), text("streams"), finish("stop")) for n in range(RUNS)],
    )
    runs = [start_run("basic", f"run {n}", created_by=user) for n in range(RUNS)]
    db = connection.settings_dict
    env = worker_env(server.base_url)
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    env["DATABASE_URL"] = f"postgres://{limited_role}@{host}:{port}/{db['NAME']}"
    web = WebProcess(env)
    worker: WorkerProcess | None = None
    try:
        clients = []
        for n in range(RUNS * CLIENTS_PER_RUN):
            client = SseClient(web.port, runs[n % RUNS].pk, token)
            client.start()
            client.opened.wait(2)
            clients.append(client)
        assert [c.error for c in clients if c.error] == [], web.output()
        # Sixty streams are open and waiting: the web process holds (almost) no connection.
        assert _role_connections(limited_role) <= 1
        worker = WorkerProcess(worker_env(server.base_url))
        wait_for(
            lambda: not any(c.is_alive() for c in clients),
            120,
            lambda: "every client's run.end\n" + worker.output() + web.output(),
        )
        assert [(c.status, c.error) for c in clients if c.error] == []
        for client in clients:
            run = Run.objects.get(pk=client.run_id)
            assert run.status == "completed"
            assert client.events == events(run)
    finally:
        if worker is not None:
            worker.stop()
        web.stop()
