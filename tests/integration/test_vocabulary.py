"""The stream's vocabulary (chamvi_runs/streaming/vocabulary/) is what the files written from it say
and what the server sends: the events of real runs, live and rebuilt, and the sockets' replies.

A client typed from client.d.ts trusts these fields: one the server drops, renames or sends with
another type breaks pages silently, and an entry the server never sends is dead code in every client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from chamvi_runs import approve, cancel_run, regenerate, send_input, start_run
from chamvi_runs.models import Run, RunInput, WaitPoint
from chamvi_runs.streaming import vocabulary
from chamvi_runs.streaming.replay import events_from_steps, replay_after
from chamvi_runs.streaming.vocabulary import files
from tests.integration.test_websocket import headers_for, run_path, socket
from tests.support.helpers import events, execute, make_user
from tests.support.scripted_server import Reply, error_event, finish, reasoning, text, tool_call, usage

WRITE = ".venv/bin/python -m chamvi_runs.streaming.vocabulary --write"
REFUND = '{"order_id": "o-1", "amount_cents": 500}'
ENVELOPE = frozenset({"type", "run_id", "seq"})
# The named types of client.d.ts that events carry, checked as the JSON they are.
OBJECTS = {"Usage", "RunError", "Decision", "ForkPoint", "ParentCall"}


def _matches(value: Any, ts: str) -> bool:
    """Whether ``value`` (decoded JSON) fits the TypeScript type ``ts``, loosely: the JSON kind, and
    the value of a literal or a ``RunStatus``."""
    alternatives = [alt.strip() for alt in ts.split("|")]
    if len(alternatives) > 1:
        return any(_matches(value, alt) for alt in alternatives)
    if ts == "Json":
        return True
    if ts.endswith("[]"):
        return isinstance(value, list) and all(_matches(item, ts[:-2]) for item in value)
    if ts == "null":
        return value is None
    if ts == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ts == "string":
        return isinstance(value, str)
    if ts == "boolean":
        return isinstance(value, bool)
    if ts.startswith('"'):
        return value == json.loads(ts)
    if ts == "RunStatus":
        return value in vocabulary.STATUSES
    if ts in OBJECTS:
        return isinstance(value, dict)
    # A type the vocabulary gained: teach this check what it means rather than pass it unchecked.
    raise AssertionError(f"tests/integration/test_vocabulary.py does not know the TypeScript type {ts!r}")


def violations(event: dict[str, Any]) -> list[str]:
    """What is wrong with ``event`` by the vocabulary (nothing: an empty list)."""
    entry = vocabulary.BY_TYPE.get(event.get("type"))  # type: ignore[arg-type]
    if entry is None:
        return [f"type {event.get('type')!r} is not in vocabulary.EVENTS"]
    keys = set(event)
    problems = []
    if missing := entry.required - keys:
        problems.append(f"{entry.type} lacks {sorted(missing)}")
    if extra := keys - entry.allowed:
        problems.append(f"{entry.type} has fields the vocabulary does not list: {sorted(extra)}")
    types = {"run_id": "string", "seq": "number", "parent_run_id": "string"} | {
        f.name: f.ts for f in entry.fields
    }
    for name, ts in types.items():
        if name in event and not _matches(event[name], ts):
            problems.append(f"{entry.type}.{name} = {event[name]!r} is not a {ts}")
    return problems


def assert_conform(sources: dict[str, list[dict[str, Any]]]) -> None:
    """Every event of every source keeps to the vocabulary; all that do not are listed at once."""
    wrong = [
        f"{source}, seq {event.get('seq')}: {problem}"
        for source, stream in sources.items()
        for event in stream
        for problem in violations(event)
    ]
    assert not wrong, "events the vocabulary does not describe:\n" + "\n".join(wrong)


# --- the written files ----------------------------------------------------------------------------

REGIONS = [(path, name) for path, texts in files.regions().items() for name in texts]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("path", "name"), REGIONS, ids=[f"{p.name}:{n}" for p, n in REGIONS])
def test_each_region_written_from_the_vocabulary_is_up_to_date(path: Path, name: str) -> None:
    written = files.region_of(path, name)
    where = f"{path.relative_to(files.ROOT)}, region {name!r}"
    assert written is not None, f"{where} is missing its markers: restore them, then run `{WRITE}`"
    assert written == files.regions()[path][name], f"{where} is not what the vocabulary writes: run `{WRITE}`"


# --- the events of real runs ----------------------------------------------------------------------


def expire_buffer(redis: Any, run: Run) -> None:
    """What the buffer's expiry does: its events go, the seq counter stays."""
    redis.delete(f"chamvi:events:{run.pk}", f"chamvi:region:{run.pk}")


def waiting_run(server: Any, owner: Any = None) -> tuple[Run, WaitPoint]:
    server.script(
        "m-approving",
        [Reply(text("Refunding."), tool_call("c1", "refund", REFUND), finish("tool_calls"), usage(8, 4))],
    )
    run = execute(start_run("approving", "refund o-1", created_by=owner))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_the_events_of_real_runs_live_and_rebuilt_keep_to_the_vocabulary(server, redis) -> None:
    sources: dict[str, list[dict[str, Any]]] = {}

    # Steered, thinking, with a tool that answers and one that raises, then a final answer.
    server.script(
        "m-basic",
        [
            Reply(
                reasoning("Two tools. "),
                text("Adding."),
                tool_call("c1", "add", '{"a": 2, "b": 3}'),
                tool_call("c2", "explode", '{"reason": "boom"}'),
                finish("tool_calls"),
                usage(10, 6),
            ),
            Reply(text("It is 5; one tool failed."), finish("stop"), usage(12, 7)),
        ],
    )
    tools = start_run("basic", "add, then explode")
    send_input(tools.pk, {"note": "be brief"})
    tools = execute(tools)
    assert tools.status == "completed"
    sources["tools and steering"] = events(tools)

    # Answered again, and forked after its first step: run.start says where each stands.
    server.script(
        "m-basic",
        [Reply(text("It is five."), finish("stop"), usage(9, 3)), Reply(text("Forked."), finish("stop"))],
    )
    again = execute(regenerate(tools.pk))
    fork = execute(start_run("basic", "fork it", from_step=(tools.pk, 0)))
    assert again.status == fork.status == "completed"
    sources["regenerated run"] = events(again)
    sources["forked run"] = events(fork)

    # Waits for approval; its buffer expires while it waits; approved, it resumes and completes.
    approved, waitpoint = waiting_run(server)
    expire_buffer(redis, approved)
    # A client from the start, once the buffer is gone: the marker, then the run rebuilt.
    sources["waiting run rebuilt behind the buffer"] = replay_after(approved.pk, 0)
    sources["waiting run, from its steps"] = events_from_steps(approved)
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"), usage(9, 2))])
    approve(waitpoint.approval_id, reason="fine")
    approved = execute(approved)
    assert approved.status == "completed"
    sources["approved run"] = events(approved)
    expire_buffer(redis, approved)
    sources["approved run rebuilt after its buffer expired"] = replay_after(approved.pk, 0)

    # Cancelled while it waits: its run.end carries the cancelled decision.
    cancelled, _ = waiting_run(server)
    assert cancel_run(cancelled.pk) == "cancelled"
    sources["cancelled run"] = events(cancelled)

    # The model breaks mid-stream: the run fails with an error.
    server.script("m-basic", [Reply(text("Half an "), error_event("upstream exploded"))])
    failed = execute(start_run("basic", "x"))
    assert failed.status == "failed"
    sources["failed run"] = events(failed)

    # A child run (delegation): every event of it names its parent.
    server.script(
        "m-triage",
        [
            Reply(tool_call("d1", "billing", '{"task": "refund"}'), finish("tool_calls")),
            Reply(text("ok"), finish("stop")),
        ],
    )
    server.script("m-billing", [Reply(text("Refunded."), finish("stop"))])
    delegating = execute(start_run("triage", "x"))
    child = execute(Run.objects.get(parent=delegating))
    assert execute(Run.objects.get(pk=delegating.pk)).status == "completed"
    sources["child run"] = events(child)
    sources["child run, from its steps"] = events_from_steps(child)
    assert all(
        e["parent_run_id"] == delegating.pk
        for e in sources["child run"] + sources["child run, from its steps"]
    )
    sources["its parent"] = events(delegating)

    for label, run in (
        ("tools", tools),
        ("approved", approved),
        ("cancelled", cancelled),
        ("failed", failed),
    ):
        sources[f"{label} run, from its steps"] = events_from_steps(Run.objects.get(pk=run.pk))

    assert all(sources.values()), {label: len(stream) for label, stream in sources.items()}
    assert_conform(sources)

    seen = [event for stream in sources.values() for event in stream]
    types = {event["type"] for event in seen}
    assert types == set(vocabulary.BY_TYPE), (
        f"never sent: {sorted(set(vocabulary.BY_TYPE) - types)}; not in the vocabulary: "
        f"{sorted(types - set(vocabulary.BY_TYPE))}"
    )
    # Optional fields included: a field no event ever carries is an entry the server never sends.
    fields = {(event["type"], key) for event in seen for key in event}
    # ``parent_run_id`` is of the envelope, on every event of a child run (checked above).
    listed = {
        (entry.type, name) for entry in vocabulary.EVENTS for name in entry.allowed if name != "parent_run_id"
    }
    assert listed <= fields, f"fields never sent: {sorted(listed - fields)}"
    # The cases these runs exist for, so that a change of scenario cannot quietly skip one.
    kinds = {event["kind"] for event in seen if event["type"] == "delta"}
    assert kinds == {"text", "reasoning"}
    assert any(e["type"] == "run.resume" and e.get("decision") for e in sources["approved run"])
    ends = {e["status"]: e for e in seen if e["type"] == "run.end"}
    assert set(ends) == {"completed", "cancelled", "failed"}
    assert ends["failed"]["error"]["code"] == "model_error"
    assert [d["decision"] for d in ends["cancelled"]["decisions"]] == ["cancelled"]
    marker = sources["waiting run rebuilt behind the buffer"][0]
    assert marker["type"] == "replay.truncated" and marker["status"] == "waiting"
    starts = {label: next(e for e in stream if e["type"] == "run.start") for label, stream in sources.items()}
    assert starts["regenerated run"]["replaces"] == tools.pk
    assert starts["forked run"]["forked_from"] == {"run_id": tools.pk, "step": 0}
    assert starts["tools and steering"]["replaced_by"] is None, "live, nothing has replaced a run yet"
    assert starts["tools run, from its steps"]["replaced_by"] == again.pk


# --- the sockets' replies -------------------------------------------------------------------------


async def next_reply(comm: WebsocketCommunicator, streamed: list[dict[str, Any]]) -> dict[str, Any]:
    """The next ack or error; the run's events before it (a socket replays them first) go to
    ``streamed``."""
    while True:
        message = await comm.receive_json_from(timeout=5)
        if "seq" not in message:
            return message
        streamed.append(message)


async def exchange(
    path: str, headers: list[tuple[bytes, bytes]], messages: list[Any], streamed: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Send each message (a str as a raw text frame) on one socket; the reply to each."""
    comm = socket(path, headers)
    assert (await comm.connect())[0]
    replies = []
    for message in messages:
        if isinstance(message, str):
            await comm.send_to(text_data=message)
        else:
            await comm.send_json_to(message)
        replies.append(await next_reply(comm, streamed))
    await comm.disconnect()
    return replies


def assert_ack(reply: dict[str, Any], action: str) -> None:
    command = next(c for c in vocabulary.COMMANDS if c.type == action)
    assert reply.get("type") == "ack", f"{action} was not acked: {reply}"
    assert set(reply) == {"type", "action"} | {f.name for f in command.ack}, reply
    assert reply["action"] == action
    for field in command.ack:
        assert _matches(reply[field.name], field.ts), (
            f"{action} ack: {field.name} is not a {field.ts}: {reply}"
        )


def assert_error(reply: dict[str, Any], code: str) -> None:
    assert set(reply) == {"type", "code", "message"} and reply["type"] == "error", reply
    assert reply["code"] in dict(vocabulary.ERROR_CODES), (
        f"{reply['code']!r} is not in vocabulary.ERROR_CODES"
    )
    assert reply["code"] == code, reply
    assert isinstance(reply["message"], str) and reply["message"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_every_command_is_acked_with_the_vocabularys_fields_and_refusals_with_its_codes(server) -> None:
    assert {c.type for c in vocabulary.COMMANDS} == {
        "input",
        "cancel",
        "approve",
        "deny",
        "answer",
        "regenerate",
        "resend",
    }
    # May start runs: a regenerate or a resend starts one.
    owner = make_user("owner", "chamvi_runs.approve_waitpoint", "chamvi_runs.add_run")
    headers = headers_for(owner)
    streamed: list[dict[str, Any]] = []
    first, first_wait = waiting_run(server, owner)
    second, second_wait = waiting_run(server, owner)

    approved = async_to_sync(exchange)(
        run_path(first, after=0),
        headers,
        [{"type": "approve", "approval_id": first_wait.approval_id}],
        streamed,
    )
    deny = {"type": "deny", "approval_id": second_wait.approval_id}
    denied, again, steered, cancelled, late, regenerated, resent = async_to_sync(exchange)(
        run_path(second, after=0),
        headers,
        [
            deny,
            deny,
            {"type": "input", "payload": "hurry"},
            {"type": "cancel"},
            {"type": "input", "payload": "x"},
            {"type": "regenerate"},
            {"type": "resend", "payload": "refund o-2"},
        ],
        streamed,
    )
    # The approved run is queued again: not settled, so not regenerated.
    (active,) = async_to_sync(exchange)(run_path(first, after=0), headers, [{"type": "regenerate"}], streamed)
    server.script(
        "m-asking",
        [Reply(text("Asking."), tool_call("q1", "ask_user", '{"question": "Which?"}'), finish("tool_calls"))],
    )
    asking = execute(start_run("asking", "ask me", created_by=owner))
    question = WaitPoint.objects.get(run=asking)
    (answered,) = async_to_sync(exchange)(
        run_path(asking, after=0),
        headers,
        [{"type": "answer", "approval_id": question.approval_id, "answer": "the blue one"}],
        streamed,
    )
    assert_ack(approved[0], "approve")
    assert_ack(denied, "deny")
    assert_error(again, "already_decided")
    assert_ack(steered, "input")
    assert_ack(cancelled, "cancel")
    assert cancelled["status"] == "cancelled"
    assert_error(late, "run_settled")
    assert_ack(regenerated, "regenerate")
    assert_ack(resent, "resend")
    assert regenerated["replaces"] == resent["replaces"] == second.pk
    assert Run.objects.get(pk=resent["run_id"]).trigger["payload"] == "refund o-2"
    assert_error(active, "run_active")
    assert_ack(answered, "answer")
    # What the sockets replayed before their replies keeps to the vocabulary too.
    assert {e["type"] for e in streamed} >= {"run.start", "run.waiting"}
    assert_conform({"socket replay": streamed})


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("not json", "invalid_message"),
        ({"type": "launch"}, "invalid_message"),
        ({"type": "input", "payload": None}, "invalid_payload"),
    ],
    ids=["not-json", "unknown-type", "null-payload"],
)
def test_a_bad_message_gets_an_error_of_the_vocabulary(message: Any, code: str) -> None:
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    (reply,) = async_to_sync(exchange)(run_path(run), headers_for(owner), [message], [])
    assert_error(reply, code)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(30)
def test_an_input_over_the_runs_caps_gets_the_vocabularys_code(settings) -> None:
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MAX_INPUTS": 2, "MAX_PENDING_INPUT_BYTES": 64}
    owner = make_user("owner")
    run = start_run("basic", "go", created_by=owner)
    messages = [{"type": "input", "payload": payload} for payload in ("a", "x" * 100, "b", "c")]
    first, pending, second, third = async_to_sync(exchange)(run_path(run), headers_for(owner), messages, [])
    assert_ack(first, "input")
    assert_error(pending, "inputs_pending")
    assert_ack(second, "input")
    assert_error(third, "too_many_inputs")
    assert [i.payload for i in RunInput.objects.filter(run=run).order_by("created_at")] == ["a", "b"]
