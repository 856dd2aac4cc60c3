"""Bad input over HTTP is a JSON 4xx that creates nothing, never a 500 (on PostgreSQL, which refuses
NUL characters in text and jsonb), and no request makes a response or a read unbounded."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.utils import timezone

from chamvi_runs import start_run
from chamvi_runs.models import Run, RunInput, Step, WaitPoint
from chamvi_runs.web.auth import create_token
from tests.integration.test_http_api import RUNS, approval_url, error_of, queued_runs, waiting_run
from tests.support.helpers import bearer, logged_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _on_postgresql() -> None:
    assert connection.vendor == "postgresql", "NUL characters matter on PostgreSQL"


# --- chunked bodies ----------------------------------------------------------------------------


def _post_chunked(path: str, headers: dict[str, str], chunks: Iterator[bytes]) -> tuple[int, bytes]:
    """A POST as an ASGI server (daphne) hands a ``Transfer-Encoding: chunked`` body to Django: no
    Content-Length, the body in pieces."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    body_sent = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if body_sent:
            await asyncio.Event().wait()  # the client stays connected until it has the response
        chunk = next(chunks, None)
        if chunk is None:
            body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async_to_sync(ASGIHandler())(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_chunked_body_is_read_only_up_to_the_limit(new_user, queue, settings):
    # A site that accepts large uploads elsewhere: Django's own cap on request.body is off.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None
    headers = bearer(create_token(new_user("chamvi_runs.add_run"), "ci")[1])
    body_size = 48 * 2**20

    def chunks() -> Iterator[bytes]:
        yield b'{"agent": "basic", "payload": "'
        piece = b"x" * 2**16
        for _ in range(body_size // len(piece)):
            yield piece

    tracemalloc.start()
    try:
        status, body = _post_chunked(RUNS, headers, chunks())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413, body
    assert b'"payload_too_large"' in body
    # The whole body is spooled to a temporary file by Django; only the limit is ever read from it.
    assert peak < body_size / 4, f"{peak / 2**20:.1f} MiB held for a {body_size / 2**20:.0f} MiB body"
    assert not Run.objects.exists() and queue.count == 0

    # Under the limit, a chunked body is accepted like any other.
    status, body = _post_chunked(RUNS, headers, iter([b'{"agent": "basic", ', b'"payload": "hi"}']))
    assert status == 201, body
    assert queued_runs(queue) == [Run.objects.get().pk]


# --- steering input ----------------------------------------------------------------------------


def test_a_null_steering_input_is_400(admin):
    run_id = admin.post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    response = admin.post(f"{RUNS}{run_id}/input/", {"payload": None})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_payload"
    assert not RunInput.objects.exists()


# --- NUL characters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": "a\u0000b"},
        {"payload": {"note": ["ok", "a\u0000b"]}},
        {"payload": {"a\u0000b": 1}},
        {"keys": {"order": "a\u0000b"}},
        {"thread": "t\u0000"},
        {"concurrency_key": "k\u0000"},
        {"id": "evt\u0000"},
        {"payload": "a\ud800b"},
        {"payload": {"\udfff": 1}},
        {"keys": {"order": "\ud83d"}},
        {"thread": "t\ud800"},
        {"concurrency_key": "k\udc00"},
        {"id": "evt\ud800"},
    ],
)
def test_a_nul_character_in_a_start_request_is_400_and_creates_nothing(admin, queue, fields):
    response = admin.post(RUNS, {"agent": "basic", "payload": 1, **fields})
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == "invalid_payload"
    assert not Run.objects.exists() and queue.count == 0


@pytest.mark.parametrize("note", ["a\u0000b", "a\ud800b"], ids=["nul", "lone-surrogate"])
def test_a_nul_character_in_a_steering_input_is_400(admin, note):
    run_id = admin.post(RUNS, {"agent": "basic", "payload": 1}).json()["id"]
    response = admin.post(f"{RUNS}{run_id}/input/", {"payload": {"note": note}})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_payload"
    assert not RunInput.objects.exists()


def test_a_nul_character_in_a_decision_is_400_and_decides_nothing(admin, admin_user, server):
    run, waitpoint = waiting_run(server)
    for reason in ("ok\u0000", "ok\ud800"):
        response = admin.post(approval_url(waitpoint, "approve"), {"reason": reason})
        assert response.status_code == 400
        assert error_of(response)["code"] == "invalid_field"
    assert admin.post("/chamvi/api/approvals/apr_%00/approve/").status_code == 404
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None

    page = logged_in(admin_user)
    for form in (
        {"action": "approve", "approval_id": waitpoint.approval_id, "reason": "ok\u0000"},
        {"action": "approve", "approval_id": "apr\u0000"},
        {"action": "cancel", "run_id": "run\u0000"},
    ):
        assert page.post("/chamvi/approvals/", form).status_code == 400
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None
    assert Run.objects.get(pk=run.pk).status == "waiting"


def test_a_nul_character_in_a_run_id_is_404(admin, admin_user):
    for url in (f"{RUNS}run_%00/", f"{RUNS}run_%00/cancel/", f"{RUNS}run_%00/input/"):
        response = admin.get(url) if url.endswith("00/") else admin.post(url, {"payload": 1})
        assert response.status_code == 404, url
        assert error_of(response)["code"] == "not_found"
    page = logged_in(admin_user)
    assert page.get("/chamvi/runs/run_%00/").status_code == 404


# --- the steps of a long run -------------------------------------------------------------------


def _long_run(steps: int) -> Run:
    """A run with many stored steps (written directly: executing hundreds of model calls would only
    make the test slow)."""
    run = start_run("basic", 1)
    now = timezone.now()
    Step.objects.bulk_create(
        Step(run=run, index=i, kind="llm", name="m-basic", output={"text": f"step {i}"}, started_at=now)
        for i in range(steps)
    )
    return run


def _indexes(body: dict[str, Any]) -> list[int]:
    return [s["index"] for s in body["steps"]]


def test_a_run_shows_its_latest_steps_and_pages_through_the_others(admin):
    run = _long_run(300)
    url = f"{RUNS}{run.pk}/"

    body = admin.get(url).json()
    assert _indexes(body) == list(range(200, 300))
    assert body["steps_page"] == {"limit": 100, "total": 300, "earlier": True, "later": False}

    back = admin.get(url, data={"steps_before": 200, "steps_limit": 150}).json()
    assert _indexes(back) == list(range(50, 200))
    assert (back["steps_page"]["earlier"], back["steps_page"]["later"]) == (True, True)
    first = admin.get(url, data={"steps_before": 50}).json()
    assert _indexes(first) == list(range(50)) and first["steps_page"]["earlier"] is False

    since = admin.get(url, data={"steps_after": 279}).json()
    assert _indexes(since) == list(range(280, 300)) and since["steps_page"]["later"] is False
    window = admin.get(url, data={"steps_after": 9, "steps_before": 13}).json()
    assert _indexes(window) == [10, 11, 12]
    nothing_new = admin.get(url, data={"steps_after": 299}).json()
    assert nothing_new["steps"] == []
    assert (nothing_new["steps_page"]["earlier"], nothing_new["steps_page"]["later"]) == (True, False)
    assert len(admin.get(url, data={"steps_limit": 1000}).json()["steps"]) == 300


@pytest.mark.parametrize(
    "query",
    [
        {"steps_limit": "²"},
        {"steps_limit": "\u0661\u0660"},  # Arabic-Indic digits: int() reads them as 10
        {"steps_after": "\uff13"},  # a fullwidth 3
        {"steps_before": "1\n"},
        {"steps_after": "-1"},
        {"steps_after": ""},
        {"steps_after": "99999999999"},
        {"steps_limit": "0"},
        {"steps_limit": "1001"},
    ],
)
def test_a_bad_steps_parameter_is_400(admin, query):
    run = _long_run(3)
    response = admin.get(f"{RUNS}{run.pk}/", data=query)
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == "invalid_field"
