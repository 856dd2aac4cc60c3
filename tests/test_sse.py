"""GET chamvi/api/runs/<id>/stream/: the run's events as Server-Sent Events."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client

from chamvi_runs import start_run
from chamvi_runs.models import Step
from tests.helpers import events, execute
from tests.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _parse(body: bytes) -> list[dict]:
    frames = [f for f in body.decode().split("\n\n") if f.strip() and not f.startswith(":")]
    out = []
    for frame in frames:
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        event = json.loads(fields["data"])
        assert fields["id"] == str(event["seq"]) and fields["event"] == event["type"]
        out.append(event)
    return out


@pytest.fixture
def client():
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    c = Client()
    c.force_login(user)
    c.user = user
    return c


def _body(response) -> bytes:
    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def test_stream_of_a_finished_run_replays_every_event_once(server, client):
    server.script("m-basic", [Reply(text("Hel"), text("lo"), finish("stop"))])
    run = execute(start_run("basic", "x", created_by=client.user))
    response = client.get(f"/chamvi/api/runs/{run.pk}/stream/")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    streamed = _parse(_body(response))
    assert streamed == events(run)
    assert streamed[-1]["type"] == "run.end"


def test_stream_resumes_after_a_seq(server, client):
    server.script("m-basic", [Reply(text("a"), text("b"), finish("stop"))])
    run = execute(start_run("basic", "x", created_by=client.user))
    streamed = _parse(_body(client.get(f"/chamvi/api/runs/{run.pk}/stream/?after=3")))
    assert [e["seq"] for e in streamed] == [e["seq"] for e in events(run) if e["seq"] > 3]
    header = _parse(_body(client.get(f"/chamvi/api/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID="4")))
    assert header[0]["seq"] == 5


def test_an_old_run_is_served_from_its_stored_steps(server, client, redis):
    server.script(
        "m-basic",
        [
            Reply(text("Adding"), tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls")),
            Reply(text("3"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x", created_by=client.user))
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:seq:{run.pk}")
    streamed = _parse(_body(client.get(f"/chamvi/api/runs/{run.pk}/stream/")))
    assert [e["seq"] for e in streamed] == list(range(1, len(streamed) + 1))
    texts = [e["text"] for e in streamed if e["type"] == "delta" and e["kind"] == "text"]
    assert texts == [s.output["text"] for s in Step.objects.filter(run=run, kind="llm")]
    assert next(e for e in streamed if e["type"] == "tool.result")["output"] == 3
    assert streamed[-1]["type"] == "run.end" and streamed[-1]["output"] == "3"


def test_stream_is_only_for_users_who_may_view_the_run(client):
    run = start_run("basic", "x", created_by=client.user)
    stranger = Client()
    stranger.force_login(get_user_model().objects.create_user("eve", password="pw"))
    assert stranger.get(f"/chamvi/api/runs/{run.pk}/stream/").status_code == 404
    assert Client().get(f"/chamvi/api/runs/{run.pk}/stream/").status_code == 401
    assert client.get(f"/chamvi/api/runs/{run.pk}/stream/?after=x").status_code == 400
