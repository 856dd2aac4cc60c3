"""Steering input has a cap per run: ``MAX_INPUTS`` inputs in its life, and
``MAX_PENDING_INPUT_BYTES`` of input waiting for its next model call. A refused input is stored
nowhere, over every surface (Python, HTTP, websocket), and racing inputs never pass a cap together."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from chamvi_runs import send_input, start_run
from chamvi_runs.core.messages import input_message
from chamvi_runs.errors import InputRefused
from chamvi_runs.models import RunInput
from tests.integration.test_websocket import command, headers_for, run_path
from tests.support.helpers import execute, session_api
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

RUNS = "/chamvi/api/runs/"


@pytest.fixture
def caps(settings):
    """Small caps: 3 inputs per run, 300 bytes pending (payloads up to 200 bytes)."""

    def set_caps(max_inputs: int = 3, pending: int = 300) -> None:
        settings.CHAMVI_RUNS = {
            **settings.CHAMVI_RUNS,
            "MAX_INPUTS": max_inputs,
            "MAX_PENDING_INPUT_BYTES": pending,
            "MAX_PAYLOAD_BYTES": 200,
        }

    set_caps()
    return set_caps


def _bytes(payload: object) -> int:
    return len(json.dumps(payload).encode())


def test_the_python_api_refuses_the_input_past_max_inputs_and_stores_nothing(caps):
    run = start_run("basic", "x")
    kept = [send_input(run.pk, f"note {n}").pk for n in range(3)]
    with pytest.raises(InputRefused) as refused:
        send_input(run.pk, "one more")
    assert refused.value.code == "too_many_inputs"
    assert "MAX_INPUTS (3)" in str(refused.value) and "taken 3 inputs" in str(refused.value)
    assert list(RunInput.objects.filter(run=run).values_list("pk", flat=True)) == kept


def test_an_input_that_would_pass_the_pending_bytes_waits_for_a_model_call_to_take_them(caps, server):
    caps(max_inputs=10, pending=300)
    run = start_run("approving", "refund o-1")
    first, second = "a" * 140, "b" * 140  # 142 bytes each as JSON: 284 pending
    send_input(run.pk, first)
    send_input(run.pk, second)
    with pytest.raises(InputRefused) as refused:
        send_input(run.pk, "c" * 20)
    assert refused.value.code == "inputs_pending"
    message = str(refused.value)
    assert "MAX_PENDING_INPUT_BYTES (300)" in message and "284 bytes" in message and "22 more" in message
    assert RunInput.objects.filter(run=run).count() == 2
    send_input(run.pk, "d" * 10)  # 12 bytes still fit
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o-1", "amount_cents": 5}'), finish("tool_calls"))],
    )
    run = execute(run)
    assert run.status == "waiting"
    request = server.requests_for("m-approving")[0]["messages"]
    assert request[-3:] == [input_message(first), input_message(second), input_message("d" * 10)]
    # The model call took them: the run waits for its approval and takes input again.
    assert send_input(run.pk, "c" * 20).payload == "c" * 20


def test_a_model_call_takes_at_most_max_pending_input_bytes_of_input(caps, server):
    caps(max_inputs=100, pending=300)
    run = start_run("basic", "x")
    sent, refused = [], 0
    for n in range(10):
        payload = str(n) * 90  # 92 bytes as JSON: a fourth would make 368
        try:
            send_input(run.pk, payload)
            sent.append(payload)
        except InputRefused as exc:
            assert exc.code == "inputs_pending"
            refused += 1
    assert (len(sent), refused) == (3, 7)
    server.script("m-basic", [Reply(text("noted"), finish("stop"))])
    execute(run)
    request = server.requests_for("m-basic")[0]["messages"]
    inputs = [m for m in request[1:] if m["role"] == "user"][1:]  # after the trigger's message
    assert inputs == [input_message(p) for p in sent]
    assert sum(_bytes(p) for p in sent) <= 300


def test_inputs_an_older_release_stored_without_their_size_count_by_their_stored_text(caps):
    caps(max_inputs=10, pending=300)
    run = start_run("basic", "x")
    RunInput.objects.create(run=run, payload="a" * 250)  # as the previous release inserts it: no size
    with pytest.raises(InputRefused) as refused:
        send_input(run.pk, "b" * 50)
    assert refused.value.code == "inputs_pending" and "252 bytes" in str(refused.value)


def test_http_answers_429_with_the_code_and_stores_nothing(caps, admin_user):
    api = session_api(admin_user)
    run = start_run("basic", "x", created_by=admin_user)
    url = f"{RUNS}{run.pk}/input/"
    assert [api.post(url, {"payload": n}).status_code for n in range(3)] == [202, 202, 202]
    response = api.post(url, {"payload": "one more"})
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "too_many_inputs" and "MAX_INPUTS" in error["message"]
    assert RunInput.objects.filter(run=run).count() == 3

    caps(max_inputs=10, pending=300)
    other = start_run("basic", "y", created_by=admin_user)
    other_url = f"{RUNS}{other.pk}/input/"
    assert api.post(other_url, {"payload": "a" * 190}).status_code == 202
    response = api.post(other_url, {"payload": "b" * 190})
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "inputs_pending" and "MAX_PENDING_INPUT_BYTES" in error["message"]
    assert list(RunInput.objects.filter(run=other).values_list("payload", flat=True)) == ["a" * 190]


def test_the_socket_replies_an_error_with_the_code_and_stores_nothing(caps, django_user_model):
    owner = django_user_model.objects.create_user("owner", "owner@example.com", "pw")
    run = start_run("basic", "x", created_by=owner)
    for n in range(3):
        send_input(run.pk, n)
    reply = async_to_sync(command)(run_path(run), headers_for(owner), {"type": "input", "payload": "more"})
    assert reply["type"] == "error" and reply["code"] == "too_many_inputs"
    assert RunInput.objects.filter(run=run).count() == 3


def _race(run_id: str, payloads: list[Any]) -> list[str]:
    """Send ``payloads`` to the run at once, each from a thread of its own: what each got."""
    start = threading.Barrier(len(payloads))
    outcomes: list[str] = []
    lock = threading.Lock()

    def race(payload: Any) -> None:
        try:
            start.wait(10)
            send_input(run_id, payload)
            outcome = "stored"
        except InputRefused as exc:
            outcome = exc.code
        finally:
            connection.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=race, args=(payload,)) for payload in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sorted(outcomes)


def test_inputs_racing_for_the_last_slot_store_exactly_the_cap(caps):
    caps(max_inputs=5, pending=10_000)
    run = start_run("basic", "x")
    for n in range(4):
        send_input(run.pk, n)
    outcomes = _race(run.pk, [f"racer {n}" for n in range(8)])
    assert outcomes == ["stored"] + ["too_many_inputs"] * 7
    assert RunInput.objects.filter(run=run).count() == 5


def test_inputs_racing_for_the_last_pending_bytes_store_no_more_than_the_cap(caps):
    caps(max_inputs=100, pending=300)
    run = start_run("basic", "x")
    send_input(run.pk, "a" * 140)  # 142 bytes: room for one more of 142, not two
    outcomes = _race(run.pk, [f"{n}" * 140 for n in range(6)])
    assert outcomes == ["inputs_pending"] * 5 + ["stored"]
    assert sum(_bytes(p) for p in RunInput.objects.filter(run=run).values_list("payload", flat=True)) <= 300
