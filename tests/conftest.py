"""Fixtures: the scripted model server, the real PostgreSQL and Redis, worker processes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from tests.scripted_server import ScriptedServer


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    from urllib.parse import urlsplit

    import tests.settings  # noqa: F401  (sets the DATABASE_URL and REDIS_URL defaults)

    for name, port in (("DATABASE_URL", 5432), ("REDIS_URL", 6379)):
        url = urlsplit(os.environ[name])
        if url.hostname and not _reachable(url.hostname, url.port or port):
            raise pytest.UsageError(
                f"{name}={os.environ[name]} is not reachable: start PostgreSQL and Redis (README, 'Tests')."
            )


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        os.environ["OPENAI_BASE_URL"] = server.base_url
        yield server


@pytest.fixture(autouse=True)
def _point_at_model_server(model_server: ScriptedServer, settings) -> None:
    settings.CHAMVI_RUNS = {
        **settings.CHAMVI_RUNS,
        "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
        "OPENAI": {"api_key": "test", "base_url": model_server.base_url, "max_retries": 2, "timeout": 20},
    }


@pytest.fixture
def redis():
    import django_rq

    connection = django_rq.get_connection("chamvi")
    yield connection


def _wipe_redis() -> None:
    import django_rq

    connection = django_rq.get_connection("chamvi")
    for pattern in ("chamvi:*", "rq:*"):
        for key in connection.scan_iter(pattern):
            connection.delete(key)


@pytest.fixture(autouse=True)
def _clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests that use the database start and end with no job, event or worker of ours in Redis."""
    uses_db = request.node.get_closest_marker("django_db") or {"db", "transactional_db"} & set(
        request.fixturenames
    )
    if uses_db:
        _wipe_redis()
    yield
    if uses_db:
        _wipe_redis()


@pytest.fixture
def server(model_server: ScriptedServer) -> Iterator[ScriptedServer]:
    """The scripted server; the test fails if it left scripted replies unconsumed."""
    model_server.clear()
    yield model_server
    leftovers = model_server.leftovers()
    model_server.clear()
    assert not leftovers, f"scripted replies were not consumed: {leftovers}"
