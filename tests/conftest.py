"""Fixtures: the scripted model server, the real PostgreSQL and Redis, users and their clients.

Only tests that use the database or Redis need those servers: the autouse fixtures below start
nothing and touch neither for any other test, so the unit tier (tests/unit, `make check`) runs
with both down. A test that needs a server that does not answer fails
with the server's URL, in CI as anywhere: never a skip, which CI would pass over in silence.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import django_rq
import pytest
from django.db.backends.postgresql.operations import DatabaseOperations
from django.test import Client
from rq.serializers import JSONSerializer

from tests.support.helpers import Api, logged_in, make_superuser, make_user, session_api
from tests.support.scripted_server import ScriptedServer

DEFAULT_PORTS = {"DATABASE_URL": 5432, "REDIS_URL": 6379}


@functools.cache
def _unreachable(name: str) -> str | None:
    """Why the server at the URL in the environment variable ``name`` cannot be used, if it cannot."""
    url = urlsplit(os.environ[name])
    if not url.hostname:  # a unix socket: the client reports what is wrong with it
        return None
    try:
        with socket.create_connection((url.hostname, url.port or DEFAULT_PORTS[name]), timeout=2):
            return None
    except OSError:
        return f"{name}={os.environ[name]} is not reachable: start PostgreSQL and Redis (README, 'Tests')."


def require(name: str) -> None:
    """Fail the test now, with the URL it needs, when ``name`` (DATABASE_URL, REDIS_URL) does not answer."""
    message = _unreachable(name)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def _postgres() -> None:
    require("DATABASE_URL")


@pytest.fixture(scope="session")
def django_db_setup(_postgres: None, django_db_setup: None) -> Iterator[None]:
    """pytest-django's test database, set up once PostgreSQL is known to answer (else every test
    that uses the database fails with the URL, not with a connection traceback); emptied by
    ``DELETE`` after each test that commits (``_delete_flush``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", _delete_flush)
        yield


_truncate_flush = DatabaseOperations.sql_flush


def _delete_flush(
    self: DatabaseOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    """Django empties the tables after each transactional test with one TRUNCATE of every table,
    for which PostgreSQL makes and fsyncs new files (0.1 to 0.5 s a test on a 2-core machine). The
    few rows a test leaves go in ~10 ms by DELETE, in the flush's one transaction (Django's foreign
    keys are deferrable); the same rows go, and sequences move on as they did."""
    if reset_sequences or allow_cascade or not tables:
        return _truncate_flush(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    return ["SET CONSTRAINTS ALL DEFERRED;", *(f"DELETE FROM {self.quote_name(t)};" for t in tables)]


def _uses_db(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.get_closest_marker("django_db")) or bool(
        {"db", "transactional_db"} & set(request.fixturenames)
    )


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        os.environ["OPENAI_BASE_URL"] = server.base_url
        yield server


MODEL_API = os.environ.get("CHAMVI_TEST_MODEL_API", "chat")
"""The API every agent's model is called through in this session: ``chat`` (Chat Completions), or
``responses``, under which the tests of the engine run again (``tests/lanes.py``): the scripted
server serves the same replies on either, and records a Responses request as the Chat Completions
request it stands for."""
MODELS = {
    "chat": "chamvi_runs.llm_openai.OpenAIModel",
    "responses": "chamvi_runs.llm_responses.ResponsesModel",
}


@pytest.fixture(autouse=True)
def _point_at_model_server(request: pytest.FixtureRequest) -> None:
    """Agents call the scripted server in tests that may run them: those that use the database or the
    server. Other tests neither start it nor pay for the settings fixture."""
    if not (_uses_db(request) or "model_server" in request.fixturenames):
        return
    model_server: ScriptedServer = request.getfixturevalue("model_server")
    settings = request.getfixturevalue("settings")
    settings.CHAMVI_RUNS = {
        **settings.CHAMVI_RUNS,
        "MODEL": MODELS[MODEL_API],
        "OPENAI": {"api_key": "test", "base_url": model_server.base_url, "max_retries": 2, "timeout": 20},
    }


@pytest.fixture
def redis():
    require("REDIS_URL")
    return django_rq.get_connection("chamvi")


def _wipe_redis() -> None:
    require("REDIS_URL")
    connection = django_rq.get_connection("chamvi")
    for pattern in ("chamvi:*", "rq:*"):
        for key in connection.scan_iter(pattern):
            connection.delete(key)


@pytest.fixture(autouse=True)
def _clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests that use the database start and end with no job, event or worker of ours in Redis."""
    uses_db = _uses_db(request)
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
    chat_calls = sum("responses" not in r for r in model_server.requests)
    model_server.clear()
    assert not leftovers, f"scripted replies were not consumed: {leftovers}"
    # A worker process, or a test that chose its own model, would run the engine on Chat Completions.
    assert MODEL_API == "chat" or not chat_calls, f"{chat_calls} model calls went to Chat Completions"


@pytest.fixture
def queue():
    """The RQ queue runs are enqueued to, emptied first."""
    q = django_rq.get_queue("chamvi", serializer=JSONSerializer)
    q.empty()
    return q


# --- users and their clients (tests.support.helpers makes named ones) -----------------------------------


@pytest.fixture
def new_user() -> Callable[..., Any]:
    """``new_user(*perms, **fields)``: a user of its own (user0, user1, ...) per call."""
    counter = itertools.count()
    return lambda *perms, **fields: make_user(f"user{next(counter)}", *perms, **fields)


@pytest.fixture
def admin_user() -> Any:
    """pytest-django's superuser, as ``root``."""
    return make_superuser()


@pytest.fixture
def admin(admin_user: Any) -> Api:
    """The JSON API as ``admin_user``, logged in by session."""
    return session_api(admin_user)


@pytest.fixture
def root_client(admin_user: Any) -> Client:
    """A Django test client logged in as ``admin_user`` (``root_client.user``)."""
    return logged_in(admin_user)


@pytest.fixture
def exporter() -> Iterator[Any]:
    """This process's OpenTelemetry spans, in the SDK's in-memory exporter (``tests/support/tracing.py``),
    emptied before and after the test."""
    from tests.support.tracing import in_memory

    memory = in_memory()
    memory.clear()
    yield memory
    memory.clear()
