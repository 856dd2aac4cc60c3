"""Claims, leases and fencing on real PostgreSQL; cancel, input, threads and concurrency keys."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F

from chamvi_runs import cancel_run, send_input, start_run, store
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.errors import LeaseLostError
from chamvi_runs.models import Checkpoint, Run, Step
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.signals import execution_error
from chamvi_runs.store import StepRecord, queries
from tests.support.helpers import events, execute, expire_lease, first_user_block
from tests.support.scripted_server import Reply, delay, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def _in_thread(fn, *args):
    result: dict = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def test_a_locked_run_is_skipped_not_waited_for():
    run = start_run("basic", "x")
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk=run.pk))
            locked.set()
            release.wait(10)

    thread, _ = _in_thread(hold_lock)
    assert locked.wait(5)
    started = time.monotonic()
    assert store.claim(run.pk, "w1", 5) is None
    assert time.monotonic() - started < 1, "skip_locked must not wait for the other transaction"
    release.set()
    thread.join(5)
    assert store.claim(run.pk, "w1", 5) is not None


def test_racing_claims_on_separate_connections_give_one_owner():
    run = start_run("basic", "x")
    barrier = threading.Barrier(8)

    def claim(owner):
        barrier.wait(5)
        return store.claim(run.pk, owner, 5)

    workers = [_in_thread(claim, f"w{n}") for n in range(8)]
    for thread, _ in workers:
        thread.join(10)
    claims = [r["value"] for _, r in workers if r.get("value")]
    assert len(claims) == 1 and all("error" not in r for _, r in workers)
    assert Run.objects.get(pk=run.pk).claim_owner == claims[0].owner


def test_lease_expiry_is_computed_by_the_database_clock():
    run = start_run("basic", "x")
    store.claim(run.pk, "w1", 30)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT claim_expires_at - statement_timestamp() FROM chamvi_runs_run WHERE id = %s", [run.pk]
        )
        remaining = cursor.fetchone()[0]
    assert timedelta(seconds=28) < remaining <= timedelta(seconds=30)


def test_a_stale_owner_writes_nothing_after_another_claim():
    run = start_run("basic", "x")
    stale = store.claim(run.pk, "frozen", 5)
    expire_lease(run.pk)
    fresh = store.claim(run.pk, "fresh", 5)
    assert fresh.attempt == stale.attempt + 1
    late = [{"role": "assistant", "content": "late"}]
    assert store.save_step(stale, [StepRecord(index=0, kind="llm")], late) is False
    assert not Step.objects.filter(run=run).exists() and not Checkpoint.objects.filter(run=run).exists()
    assert store.settle(stale, "completed", output="late") is False
    assert store.renew(stale, 5) is False
    assert Run.objects.get(pk=run.pk).status == "running"
    assert store.settle(fresh, "completed", output="ok") is True


def test_a_live_lease_cannot_be_claimed_twice():
    run = start_run("basic", "x")
    assert store.claim(run.pk, "w1", 30) is not None
    assert store.claim(run.pk, "w2", 30) is None


def test_an_execution_that_loses_its_lease_stops_and_writes_nothing(server):
    server.script("m-basic", [Reply(text("slow "), delay(3), text("answer"), finish("stop"))])
    run = start_run("basic", "x")
    errors = []

    def receiver(sender, run_id, error, **kwargs):
        errors.append(error)

    execution_error.connect(receiver)
    try:
        thread, result = _in_thread(execute, run.pk)
        deadline = time.monotonic() + 5
        while not Run.objects.filter(pk=run.pk, claim_owner__isnull=False).exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        expire_lease(run.pk)
        thief = store.claim(run.pk, "thief", 30)
        assert thief is not None
        thread.join(10)
    finally:
        execution_error.disconnect(receiver)
    assert "error" not in result
    assert [type(e) for e in errors] == [LeaseLostError]
    fresh = Run.objects.get(pk=run.pk)
    assert (fresh.status, fresh.claim_owner, fresh.error_code) == ("running", "thief", "")
    assert not Step.objects.filter(run=run).exists()


def test_the_janitor_re_enqueues_expired_claims_and_the_next_execution_resumes(server, redis):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls")),
            Reply(text("3"), finish("stop")),
        ],
    )
    run = start_run("basic", "x")
    crashed = store.claim(run.pk, "crashed-worker", 30)
    # The crashed execution had finished its first step before dying.
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    store.count_model_call(crashed)
    store.save_step(
        crashed,
        [
            StepRecord(
                index=0, kind="llm", output={"text": "", "tool_calls": [call], "finish_reason": "tool_calls"}
            ),
            StepRecord(index=1, kind="tool", name="add", input={"a": 1, "b": 2}, output=3),
        ],
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
        ],
    )
    redis.delete("rq:queue:chamvi")
    assert tick_once().enqueued == 0, "a live lease is left alone"
    expire_lease(run.pk)
    assert tick_once().enqueued == 1
    import django_rq

    job_args = [job.args for job in django_rq.get_queue("chamvi").get_jobs()]
    assert [run.pk] in job_args
    server.clear()
    server.script("m-basic", [Reply(text("resumed"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.output == "resumed" and run.attempt == 2
    assert events(run)[0]["type"] == "run.resume"
    assert list(Step.objects.filter(run=run).values_list("index", "attempt")) == [(0, 1), (1, 1), (2, 2)]


def test_cancel_of_a_queued_run_settles_at_once():
    run = start_run("basic", "x")
    assert cancel_run(run.pk) == "cancelled"
    run.refresh_from_db()
    assert run.status == "cancelled" and run.finished_at is not None
    assert events(run)[-1]["type"] == "run.end" and events(run)[-1]["status"] == "cancelled"
    assert execute(run).status == "cancelled", "a job for a cancelled run does nothing"


def test_cancel_of_a_running_run_aborts_the_model_call_within_a_second(server):
    server.script("m-basic", [Reply(text("long "), delay(10), text("story"), finish("stop"))])
    run = start_run("basic", "x")
    thread, _result = _in_thread(execute, run.pk)
    deadline = time.monotonic() + 5
    while not Step.objects.filter(run=run).exists() and not any(e["type"] == "delta" for e in events(run)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    asked = time.monotonic()
    assert cancel_run(run.pk) == "running"
    thread.join(10)
    took = time.monotonic() - asked
    assert took < 2.0, f"cancel took {took:.2f}s"
    run.refresh_from_db()
    assert run.status == "cancelled" and run.claim_owner is None
    assert events(run)[-1]["status"] == "cancelled"


def test_cancel_after_tool_calls_leaves_a_continuable_history(server):
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 1}'), finish("tool_calls"))],
    )
    run = execute(start_run("approving", "x"))
    assert run.status == "waiting"
    assert cancel_run(run.pk) == "cancelled"
    messages = Checkpoint.objects.get(run=run).messages
    assert not open_tool_calls(messages)
    assert "cancelled" in messages[-1]["content"]


def test_send_input_is_taken_before_the_next_model_call_and_listed_in_the_receipt(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 1}'), finish("tool_calls")),
            Reply(text("2, and noted"), finish("stop")),
        ],
    )
    run = start_run("basic", "x")
    item = send_input(run.pk, "also say hi")
    run = execute(run)
    assert run.status == "completed"
    first = server.requests_for("m-basic")[0]["messages"]
    assert first[-1] == {"role": "user", "content": "also say hi"}
    assert events(run)[-1]["inputs"] == [item.pk]


def test_inputs_of_every_json_shape_reach_the_model_in_the_order_they_were_sent(server):
    from chamvi_runs.core.messages import input_message

    server.script("m-basic", [Reply(text("noted"), finish("stop"))])
    run = start_run("basic", "x")
    payloads = ["plain", '"quoted"', {"n": 2, "nested": ["a", None]}, [1, 2], 7, True]
    items = [send_input(run.pk, payload) for payload in payloads]
    run = execute(run)
    messages = server.requests_for("m-basic")[0]["messages"]
    assert messages[-len(payloads) :] == [input_message(payload) for payload in payloads]
    assert events(run)[-1]["inputs"] == [item.pk for item in items]


def test_runs_of_a_thread_continue_one_conversation(server):
    server.script("m-basic", [Reply(text("Nice to meet you, Ada."), finish("stop"))])
    first = execute(start_run("basic", "I am Ada", thread="t-42"))
    server.script("m-basic", [Reply(text("You are Ada."), finish("stop"))])
    second = execute(start_run("basic", "Who am I?", thread="t-42"))
    assert first.status == second.status == "completed"
    messages = server.requests_for("m-basic")[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == "Nice to meet you, Ada."
    assert first_user_block({"messages": messages[3:]})["payload"] == "Who am I?"


def test_a_thread_never_runs_two_runs_at_once(server):
    first = start_run("basic", "one", thread="t-1")
    second = start_run("basic", "two", thread="t-1")
    assert store.claim(second.pk, "w", 5) is None, "the younger run waits for the elder"
    held = store.claim(first.pk, "w", 5)
    assert store.claim(second.pk, "w", 5) is None
    store.settle(held, "completed", output="done")
    assert queries.next_in_line(Run.objects.get(pk=first.pk)) == [second.pk]
    assert store.claim(second.pk, "w", 5) is not None


def test_concurrency_key_admits_one_run_at_a_time_in_creation_order():
    runs = [start_run("basic", n, concurrency_key="tenant-1") for n in range(6)]
    barrier = threading.Barrier(len(runs))

    def claim(run_id):
        barrier.wait(5)
        return store.claim(run_id, f"w-{run_id}", 5)

    workers = [_in_thread(claim, r.pk) for r in reversed(runs)]
    for thread, _ in workers:
        thread.join(10)
    claimed = [r["value"].run_id for _, r in workers if r.get("value")]
    assert claimed == [runs[0].pk]


def test_an_idempotent_trigger_id_returns_the_first_run():
    first = start_run("basic", "x", id="evt-1")
    again = start_run("basic", "y", id="evt-1")
    assert again.pk == first.pk and Run.objects.count() == 1
    other_agent = start_run("structured", "x", id="evt-1")
    assert other_agent.pk != first.pk


def _age(run_id: str, seconds: int = 3600) -> None:
    Run.objects.filter(pk=run_id).update(updated_at=F("updated_at") - timedelta(seconds=seconds))


def test_the_janitor_rings_once_for_a_run_whose_job_was_lost(redis):
    import django_rq

    run = start_run("basic", "x")
    redis.delete("rq:queue:chamvi")  # Redis lost the job
    _age(run.pk)
    assert tick_once().enqueued == 1
    assert tick_once().enqueued == 0, "a run whose job is still waiting gets no second doorbell"
    assert [job.args for job in django_rq.get_queue("chamvi").get_jobs()] == [[run.pk]]


def test_the_janitor_leaves_runs_behind_an_elder_of_their_key_alone(redis):
    elder = start_run("basic", "one", concurrency_key="k")
    younger = start_run("basic", "two", concurrency_key="k")
    redis.delete("rq:queue:chamvi")
    _age(elder.pk)
    _age(younger.pk)
    tick_once()
    import django_rq

    assert [job.args for job in django_rq.get_queue("chamvi").get_jobs()] == [[elder.pk]]


@pytest.mark.parametrize(
    ("finish", "error", "status", "code"),
    [
        ("stop", "", "completed", ""),
        ("error", "HTTP 500: boom", "failed", "model_error"),
        (None, "the stream ended without a finish reason", "failed", "incomplete_response"),
    ],
)
def test_a_run_whose_last_step_ended_it_settles_without_another_model_call(
    server, finish, error, status, code
):
    run = start_run("basic", "x")
    dead = store.claim(run.pk, "died-before-settling", 30)
    store.count_model_call(dead)
    store.save_step(
        dead,
        [StepRecord(index=0, kind="llm", output={"text": "All done.", "finish_reason": finish}, error=error)],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "All done."}],
        finish_reason=finish or "",
    )
    expire_lease(run.pk)
    run = execute(run)
    assert (run.status, run.error_code) == (status, code)
    assert run.output == ("All done." if status == "completed" else None)
    assert server.requests_for("m-basic") == [], "the saved step is not repeated"


def test_no_transaction_or_row_lock_is_held_during_tool_and_model_calls(server):
    server.script(
        "m-probing",
        [
            Reply(tool_call("c1", "probe_locks", "{}"), finish("tool_calls")),
            Reply(text("slow "), delay(1.5), text("end"), finish("stop")),
        ],
    )
    run = start_run("probing", "x")
    thread, result = _in_thread(execute, run.pk)
    # While the second model call streams, another connection can lock the run's row at once.
    wait_for_delta = time.monotonic() + 10
    while not any(e["type"] == "delta" and e["step"] == 2 for e in events(run)):
        assert time.monotonic() < wait_for_delta
        time.sleep(0.05)
    with transaction.atomic():
        assert Run.objects.select_for_update(nowait=True).filter(pk=run.pk).exists()
    thread.join(10)
    assert "error" not in result
    assert Step.objects.get(run=run, kind="tool").output == {"in_transaction": False, "row_free": True}


def test_a_worker_whose_renewals_fail_stops_before_its_lease_runs_out(server, monkeypatch, settings):
    from django.db import OperationalError

    server.script("m-basic", [Reply(text("long "), delay(8), text("story"), finish("stop"))])
    run = start_run("basic", "x")

    def unreachable(*args, **kwargs):
        raise OperationalError("the database is unreachable")

    monkeypatch.setattr(store, "renew_many", unreachable)
    started = time.monotonic()
    execute(run)
    took = time.monotonic() - started
    lease = settings.CHAMVI_RUNS["LEASE_SECONDS"]
    assert took < lease, f"the execution ran {took:.1f}s on a lease of {lease}s it could not renew"
    run.refresh_from_db()
    assert run.status == "running" and not Step.objects.filter(run=run).exists()


def test_a_step_longer_than_the_lease_keeps_its_claim(server, settings):
    lease = settings.CHAMVI_RUNS["LEASE_SECONDS"]
    server.script(
        "m-basic",
        [
            Reply(
                text("thinking "),
                delay(lease + 1),
                tool_call("c1", "slow", f'{{"seconds": {lease + 1}}}'),
                finish("tool_calls"),
            ),
            Reply(text("done"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed" and run.attempt == 1, "the heartbeat renewed through stream and tool"


def test_jobs_are_json_and_carry_only_the_run_id(redis):
    import json
    import zlib

    run = start_run("basic", "x")
    job_ids = redis.lrange("rq:queue:chamvi", 0, -1)
    assert len(job_ids) == 1
    data = zlib.decompress(redis.hget(f"rq:job:{job_ids[0].decode()}", "data"))  # RQ compresses job data
    assert json.loads(data)[2:] == [[run.pk], {}], "function, instance, args, kwargs as JSON"


def test_budgets_count_the_model_calls_of_earlier_executions(server):
    run = start_run("limited", "x")  # max_steps=2
    earlier = store.claim(run.pk, "earlier-worker", 30)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    store.count_model_call(earlier)
    store.save_step(
        earlier,
        [
            StepRecord(
                index=0, kind="llm", output={"text": "", "tool_calls": [call], "finish_reason": "tool_calls"}
            ),
            StepRecord(index=1, kind="tool", name="add", input={"a": 1, "b": 2}, output=3),
        ],
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
        ],
    )
    expire_lease(run.pk)
    server.script("m-limited", [Reply(tool_call("c2", "add", '{"a": 3, "b": 3}'), finish("tool_calls"))])
    run = execute(run)
    assert (run.status, run.error_code, run.model_calls) == ("failed", "budget_exceeded", 2)


def test_a_cancel_that_lands_while_a_run_goes_back_to_waiting_closes_its_approval():
    # A run resumed after one decision finds its next approval still open and goes back to waiting;
    # a cancel requested meanwhile wins, and the approval must not stay open on a cancelled run.
    from chamvi_runs.core.states import Status
    from chamvi_runs.models import WaitPoint

    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(status="waiting")
    WaitPoint.objects.create(
        run_id=run.pk, step_index=0, tool_name="refund", input={}, expires_at=run.created_at
    )
    Run.objects.filter(pk=run.pk).update(status="running")
    claim = store.claim(run.pk, "w1", 30)
    assert cancel_run(run.pk) == "running"  # held: its owner settles it
    assert store.back_to_waiting(claim) is False
    assert store.settle(claim, Status.CANCELLED)
    closed = WaitPoint.objects.get(run_id=run.pk)
    assert (closed.decision, closed.reason) == ("cancelled", "run cancelled")
