"""Runs in the world they are sold into (issue 6): many users on one site, cancels that race a pause,
providers that reuse tool-call ids, tools that kill their worker, approvals decided while a cancel
lands, notifiers that hang, and NUL characters. In-process executions against the real PostgreSQL,
real worker processes where a worker must die."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from chamvi_runs import api, approve, cancel_run, send_input, start_run, store
from chamvi_runs.agents.agent import Approval, registry
from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.errors import InvalidPayload, ThreadForbidden
from chamvi_runs.models import Checkpoint, EffectRecord, Run, Step, Thread, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.runtime.notifications import notify
from tests.helpers import events, execute, expire_lease, make_user
from tests.processes import WorkerProcess, wait_for, worker_env
from tests.scripted_server import Reply, finish, text, tool_call, usage
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'
BIG_REFUND = '{"order_id": "o-2", "amount_cents": 99999}'


def _all_text(request: dict) -> str:
    return repr(request["messages"])


# --- threads belong to someone ------------------------------------------------------------------


def test_another_user_cannot_join_a_thread_and_gets_none_of_its_history(server):
    alice, bob = make_user("alice"), make_user("bob")
    server.script("m-basic", [Reply(text("alice's secret order o-77"), finish("stop"))])
    first = execute(start_run("basic", "my order?", thread="t-42", created_by=alice))
    assert first.status == "completed"
    assert Thread.objects.get(name="t-42").owner == alice

    with pytest.raises(ThreadForbidden):
        start_run("basic", "show me", thread="t-42", created_by=bob)
    assert Run.objects.filter(created_by=bob).count() == 0
    # Code that starts runs for nobody may not read a user's thread either.
    with pytest.raises(ThreadForbidden):
        start_run("basic", "show me", thread="t-42")

    server.script("m-basic", [Reply(text("again"), finish("stop"))])
    second = execute(start_run("basic", "and now?", thread="t-42", created_by=alice))
    assert second.status == "completed"
    assert "alice's secret" in _all_text(server.requests_for("m-basic")[-1])


def test_a_user_allowed_to_view_every_run_may_join_a_thread(server):
    alice, support = make_user("alice"), make_user("support", "view_run")
    server.script("m-basic", [Reply(text("alice's history"), finish("stop"))])
    execute(start_run("basic", "x", thread="t-7", created_by=alice))
    server.script("m-basic", [Reply(text("support here"), finish("stop"))])
    run = execute(start_run("basic", "y", thread="t-7", created_by=support))
    assert run.status == "completed"
    assert "alice's history" in _all_text(server.requests_for("m-basic")[-1])


def test_a_run_never_receives_history_its_creator_may_not_view(server):
    """Runs written before threads had owners (or by a site that bypassed start_run): the first
    owner named in the table gets only what they may see."""
    alice, bob = make_user("alice"), make_user("bob")
    server.script("m-basic", [Reply(text("alice's secret"), finish("stop"))])
    execute(start_run("basic", "x", thread="legacy", created_by=alice))
    Thread.objects.filter(name="legacy").update(owner=bob)  # as if bob's run came first
    server.script("m-basic", [Reply(text("bob's answer"), finish("stop"))])
    run = execute(start_run("basic", "y", thread="legacy", created_by=bob))
    assert run.status == "completed"
    request = server.requests_for("m-basic")[-1]
    assert "alice's secret" not in _all_text(request)
    assert [m["role"] for m in request["messages"]] == ["system", "user"]


def test_two_first_runs_racing_for_a_thread_give_it_exactly_one_owner():
    alice, bob = make_user("alice"), make_user("bob")
    outcomes: list[str] = []

    def start(user: User) -> None:
        try:
            start_run("basic", "x", thread="contested", created_by=user)
            outcomes.append(user.username)
        except ThreadForbidden:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(u,)) for u in (alice, bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    owner = Thread.objects.get(name="contested").owner
    assert sorted(outcomes) == sorted([owner.username, "refused"])
    assert set(Run.objects.values_list("created_by__username", flat=True)) == {owner.username}


# --- a cancel wins over a pause -----------------------------------------------------------------


def test_a_cancel_requested_while_the_model_answers_wins_over_the_wait_it_would_open(server):
    agent = registry.get("approving")
    original = agent.approvals["refund"]

    def cancel_then_ask(arguments, ctx) -> bool:
        # The cancel lands after the model's answer and before the wait point is written.
        assert cancel_run(ctx.run.pk) == "running"
        return True

    agent.approvals["refund"] = Approval(when=cancel_then_ask)
    try:
        server.script(
            "m-approving",
            [
                Reply(
                    tool_call("c1", "add", '{"a": 1, "b": 2}'),
                    tool_call("c2", "refund", REFUND),
                    finish("tool_calls"),
                )
            ],
        )
        run = execute(start_run("approving", "x"))
    finally:
        agent.approvals["refund"] = original
    assert run.status == "cancelled"
    assert not WaitPoint.objects.filter(run=run).exists()
    assert Refund.objects.count() == 0
    # The step that completed is kept; the call that would have waited is answered as cancelled.
    steps = list(Step.objects.filter(run=run).values_list("kind", "name"))
    assert steps == [("llm", "m-approving"), ("tool", "add")]
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


def test_a_cancel_requested_before_a_drain_wins_over_interrupted(server):
    from chamvi_runs.core.types import AbortSignal
    from chamvi_runs.runtime.engine import Execution

    run = start_run("basic", "x")
    held = store.claim(run.pk, "draining-worker", 30)
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)  # requested while it was claimed
    shutdown = AbortSignal()
    shutdown.set("drain")
    assert Execution(held, shutdown).run() == "cancelled"
    run.refresh_from_db()
    assert (run.status, run.claim_owner) == ("cancelled", None)


def test_a_claim_of_a_run_with_a_cancel_requested_settles_it_cancelled(server):
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    run = execute(run)
    assert run.status == "cancelled" and run.model_calls == 0


# --- approvals belong to one call, not to a provider's id ---------------------------------------


def test_a_reused_tool_call_id_does_not_get_a_later_call_through_an_earlier_approval(server):
    server.script(
        "m-approving",
        [
            Reply(tool_call("call_0", "refund", REFUND), finish("tool_calls")),
            # The provider numbers calls per turn: the next turn's call has the same id.
            Reply(tool_call("call_0", "refund", BIG_REFUND), finish("tool_calls")),
        ],
    )
    run = execute(start_run("approving", "x"))
    first = WaitPoint.objects.get(run=run)
    approve(first.approval_id)
    run = execute(run)
    assert run.status == "waiting"
    assert list(Refund.objects.values_list("order_id", flat=True)) == ["o-1"]
    second = WaitPoint.objects.get(run=run, decision__isnull=True)
    assert (second.model_step, second.call_position, second.input["order_id"]) == (3, 0, "o-2")


def test_an_approval_is_bound_to_the_exact_arguments_it_was_asked_for(server):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    approve(waitpoint.approval_id)
    # Tamper with the history's arguments after the decision: the approval no longer covers them.
    checkpoint = Checkpoint.objects.get(run=run)
    messages = checkpoint.messages
    messages[-1]["tool_calls"][0]["function"]["arguments"] = '{"order_id": "o-1", "amount_cents": 500000}'
    Checkpoint.objects.filter(pk=checkpoint.pk).update(messages=messages, whole_step=None, whole_length=None)
    server.script("m-approving", [Reply(text("ok"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and Refund.objects.count() == 0
    step = Step.objects.get(run=run, kind="tool")
    assert step.error == "not run: the approval was given for other arguments"


def test_an_approved_call_with_a_nul_in_its_arguments_runs(server):
    # The approver saw the arguments as stored (the NUL replaced); the approval covers that call.
    nul_refund = '{"order_id": "o\\u0000x", "amount_cents": 5}'
    server.script("m-approving", [Reply(tool_call("c1", "refund", nul_refund), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    assert waitpoint.input == {"order_id": "o\ufffdx", "amount_cents": 5}
    approve(waitpoint.approval_id)
    server.script("m-approving", [Reply(text("ok"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    step = Step.objects.get(run=run, kind="tool")
    assert not step.error.startswith("not run"), step.error
    assert EffectRecord.objects.filter(run=run).count() == 1


# --- every terminal settle leaves a history a thread can continue -------------------------------


def test_a_run_whose_agent_is_gone_fails_with_its_history_closed(server):
    alice = make_user("alice")
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x", thread="t-gone", created_by=alice))
    approve(WaitPoint.objects.get(run=run).approval_id)
    agent = registry.get("approving")
    registry.unregister("approving")
    try:
        run = execute(run)
    finally:
        registry.register(agent)
    assert (run.status, run.error_code) == ("failed", "agent_not_found")
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)
    # The thread goes on: the provider gets a history with every call answered.
    server.script("m-basic", [Reply(text("continued"), finish("stop"))])
    after = execute(start_run("basic", "next", thread="t-gone", created_by=alice))
    assert after.status == "completed"
    assert not open_tool_calls(server.requests_for("m-basic")[-1]["messages"])


def test_an_internal_error_tells_viewers_no_internals_and_closes_the_history(server, monkeypatch):
    from chamvi_runs.core import decisions

    def broken(*args, **kwargs):
        raise RuntimeError("password=hunter2 at db-7.internal")

    server.script("m-basic", [Reply(tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls"))])
    monkeypatch.setattr(decisions, "invalid_streak", broken)
    run = execute(start_run("basic", "x"))
    assert (run.status, run.error_code) == ("failed", "internal_error")
    assert "hunter2" not in run.error_message and "RuntimeError" in run.error_message
    assert not open_tool_calls(Checkpoint.objects.get(run=run).messages)


# --- poison runs ---------------------------------------------------------------------------------


@pytest.fixture
def spawn(server) -> Iterator:
    workers: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(worker_env(server.base_url))
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def _kill_loop(server, spawn, run: Run, deaths: int) -> list[WorkerProcess]:
    """Let a worker take the run and die in its tool, then move the lease into the past and ring the
    janitor, ``deaths`` times; returns the workers still alive, which take the run next.

    The ``deaths + 1`` workers start at once, so their start-ups (seconds each) overlap: the queue
    holds one job of the run at a time, so each death is a worker of its own."""
    workers = [spawn() for _ in range(deaths + 1)]

    def dead() -> list[WorkerProcess]:
        return [w for w in workers if w.proc.poll() is not None]

    def logs() -> str:
        return "\n".join(w.output()[-1500:] for w in workers)

    for n in range(deaths):
        wait_for(lambda n=n: len(dead()) == n + 1, 40, logs)
        assert all(w.proc.returncode != 0 for w in dead()), logs()
        assert Run.objects.get(pk=run.pk).model_calls == n + 1, "the call the worker died after counts"
        expire_lease(run.pk)
        assert tick_once().enqueued == 1
    return [w for w in workers if w not in dead()]


def _output(workers: list[WorkerProcess]) -> str:
    return "\n".join(w.output() for w in workers)


@pytest.mark.timeout(180)
def test_a_tool_that_kills_its_worker_fails_the_run_after_max_attempts(server, spawn, settings):
    attempts = settings.CHAMVI_RUNS.get("MAX_ATTEMPTS", 5)
    kill = Reply(tool_call("c1", "crash_worker", '{"code": 3}'), usage(100, 10), finish("tool_calls"))
    server.script("m-poison", [kill] * attempts)
    run = start_run("poison", "x")
    rescuers = _kill_loop(server, spawn, run, attempts)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 40, lambda: _output(rescuers))
    run.refresh_from_db()
    assert run.error_code == "too_many_attempts"
    # Every paid call is on the bill, though no step of them was ever saved.
    assert (run.model_calls, run.input_tokens, run.output_tokens) == (attempts, 100 * attempts, 10 * attempts)
    assert not Step.objects.filter(run=run).exists()


@pytest.mark.timeout(120)
def test_model_calls_lost_with_a_dead_worker_count_against_max_steps(server, spawn):
    kill = Reply(tool_call("c1", "crash_worker", '{"code": 3}'), finish("tool_calls"))
    server.script("m-poison_limited", [kill, kill])  # max_steps=2
    run = start_run("poison_limited", "x")
    rescuers = _kill_loop(server, spawn, run, 2)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "failed", 40, lambda: _output(rescuers))
    run.refresh_from_db()
    assert (run.error_code, run.model_calls) == ("budget_exceeded", 2)


def test_an_execution_that_saves_a_step_resets_the_count_of_stalled_ones(server):
    run = start_run("basic", "x")
    Run.objects.filter(pk=run.pk).update(stalled_executions=4)
    server.script("m-basic", [Reply(text("fine"), finish("stop"))])
    run = execute(run)
    assert run.status == "completed" and run.stalled_executions == 0


# --- effect records and new arguments -----------------------------------------------------------


def test_a_repeated_call_with_other_arguments_is_told_what_actually_ran(server):
    run = start_run("basic", "x")
    dead = store.claim(run.pk, "died-after-the-effect", 30)
    key = f"{run.pk}:0:0:refund"
    # The first execution refunded 500 and died before its step was saved.
    store.record_effect(dead, key, "refund", {"order_id": "o-1", "amount_cents": 500}, {"refunded": 500}, "")
    expire_lease(run.pk)
    server.script(
        "m-basic",
        [
            # The repeated model call asks for another amount at the same place.
            Reply(
                tool_call("c9", "refund", '{"order_id": "o-1", "amount_cents": 700}'), finish("tool_calls")
            ),
            Reply(text("ok"), finish("stop")),
        ],
    )
    run = execute(run)
    assert run.status == "completed"
    assert Refund.objects.count() == 0 and EffectRecord.objects.count() == 1
    step = Step.objects.get(run=run, kind="tool")
    assert step.output is None
    assert "already ran once" in step.error and '"amount_cents": 500' in step.error
    told = server.requests_for("m-basic")[-1]["messages"][-1]
    assert told["role"] == "tool" and "already ran once" in told["content"]


# --- notifications -------------------------------------------------------------------------------


def test_the_janitor_does_not_resend_while_the_first_notifier_call_is_still_running(server):
    agent = registry.get("approving")
    entered, release = threading.Event(), threading.Event()
    tokens: list[str] = []

    def slow_mail(run, waitpoint) -> None:
        tokens.append(waitpoint.token)
        entered.set()
        release.wait(20)

    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    agent.notifier = slow_mail
    try:
        worker = threading.Thread(target=lambda: (execute(start_run("approving", "x")), connection.close()))
        worker.start()
        assert entered.wait(20)
        # Two janitors tick while the mail is being sent: neither sends again.
        assert tick_once().notified == 0 and tick_once().notified == 0
        release.set()
        worker.join(20)
    finally:
        agent.notifier = None
        release.set()
    waitpoint = WaitPoint.objects.get()
    assert waitpoint.notified_at is not None and len(tokens) == 1
    assert approve(waitpoint.approval_id, token=tokens[0]).decision == "approved"


def test_two_janitors_never_call_the_notifier_twice_for_one_wait_point(server):
    agent = registry.get("approving")
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    calls: list[str] = []
    agent.notifier = lambda run, waitpoint: (_ for _ in ()).throw(ConnectionError("down"))
    try:
        run = execute(start_run("approving", "x"))
    finally:
        agent.notifier = None
    waitpoint = WaitPoint.objects.get(run=run)
    assert waitpoint.notify_attempts == 1 and waitpoint.next_notify_at is not None
    WaitPoint.objects.filter(pk=waitpoint.pk).update(next_notify_at=Now() - timedelta(seconds=1))
    agent.notifier = lambda run, wp: calls.append(wp.token)
    try:
        barrier = threading.Barrier(2)

        def janitor() -> None:
            barrier.wait(5)
            notify(agent, Run.objects.get(pk=run.pk), WaitPoint.objects.get(pk=waitpoint.pk), resend=True)
            connection.close()

        threads = [threading.Thread(target=janitor) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    finally:
        agent.notifier = None
    assert len(calls) == 1


def test_a_failing_notifier_backs_off_longer_each_time():
    assert [store.notify_backoff(n).total_seconds() for n in (1, 2, 3, 8, 20)] == [30, 60, 120, 3600, 3600]


# --- the database's clock ------------------------------------------------------------------------


@pytest.fixture
def skewed_host(monkeypatch):
    """This host's clock runs an hour ahead of the database's (and of the other hosts')."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(hours=1))


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_approval_expiry_is_decided_by_the_database_clock(server, skewed_host):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))  # approval_ttl = 5 minutes
    waitpoint = WaitPoint.objects.get(run=run)
    assert abs((waitpoint.expires_at - _db_now()) - timedelta(minutes=5)) < timedelta(seconds=30)
    # Not expired by the database's clock, though this host's clock is past it: the approval stands.
    assert tick_once().expired == 0
    assert approve(waitpoint.approval_id).decision == "approved"


def test_runs_of_a_key_start_in_the_order_the_database_saw_them(monkeypatch):
    first = start_run("basic", "x", concurrency_key="k")
    real = timezone.now
    # The second comes from a host whose clock is an hour behind.
    monkeypatch.setattr(timezone, "now", lambda: real() - timedelta(hours=1))
    second = start_run("basic", "y", concurrency_key="k")
    first, second = Run.objects.get(pk=first.pk), Run.objects.get(pk=second.pk)
    assert first.created_at < second.created_at
    assert store.claim(second.pk, "w", 30) is None, "the elder goes first"
    assert store.claim(first.pk, "w", 30) is not None


def test_a_concurrent_approve_and_cancel_never_deadlock(server):
    for n in range(6):
        server.script("m-approving", [Reply(tool_call(f"c{n}", "refund", REFUND), finish("tool_calls"))])
    runs = [execute(start_run("approving", str(n))) for n in range(6)]
    errors: list[BaseException] = []

    def attempt(action) -> None:
        try:
            action()
        except BaseException as exc:
            if type(exc).__name__ not in ("DecisionRefused",):
                errors.append(exc)
        finally:
            connection.close()

    for run in runs:
        approval = WaitPoint.objects.get(run=run).approval_id
        barrier = threading.Barrier(2)
        pair = [
            threading.Thread(target=attempt, args=(lambda a=approval, b=barrier: (b.wait(5), approve(a)),)),
            threading.Thread(target=attempt, args=(lambda r=run.pk, b=barrier: (b.wait(5), cancel_run(r)),)),
        ]
        for t in pair:
            t.start()
        for t in pair:
            t.join(20)
    assert errors == []
    for run in runs:
        run.refresh_from_db()
        decision = WaitPoint.objects.get(run=run).decision
        # One of the two won, cleanly: approved and re-queued, or cancelled with the approval closed.
        assert (run.status, decision) in (
            ("running", "approved"),  # approved; the cancel found it held or lost to it
            ("cancelled", "approved"),  # approved, then cancelled before a worker took it
            ("cancelled", "cancelled"),  # cancelled while waiting: the approval closed with it
        )


# --- NUL characters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: start_run("basic", {"note": "a\x00b"}), "payload"),
        (lambda: start_run("basic", {"k\x00": 1}), "payload"),
        (lambda: start_run("basic", "x", thread="t\x00"), "thread"),
        (lambda: start_run("basic", "x", concurrency_key="k\x00"), "concurrency_key"),
        (lambda: start_run("basic", "x", id="i\x00"), "id"),
        (lambda: start_run("basic", "x", keys={"user": "u\x00"}), "keys"),
    ],
)
def test_nul_characters_from_callers_are_refused_and_create_nothing(call, what):
    with pytest.raises(InvalidPayload, match=what):
        call()
    assert not Run.objects.exists() and not Thread.objects.exists()


def test_null_and_nul_steering_inputs_are_refused(server):
    run = start_run("basic", "x")
    with pytest.raises(InvalidPayload, match="null"):
        send_input(run.pk, None)
    with pytest.raises(InvalidPayload, match="NUL"):
        send_input(run.pk, "a\x00b")
    assert not run.inputs.exists()
    api.cancel_run(run.pk)


def test_a_decision_reason_with_a_nul_is_refused_and_decides_nothing(server):
    server.script("m-approving", [Reply(tool_call("c1", "refund", REFUND), finish("tool_calls"))])
    run = execute(start_run("approving", "x"))
    waitpoint = WaitPoint.objects.get(run=run)
    with pytest.raises(InvalidPayload, match="NUL"):
        approve(waitpoint.approval_id, reason="ok\x00")
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


def test_nul_characters_from_the_model_and_tools_are_stored_as_replacement_characters(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "explode", '{"reason": "bad\\u0000byte"}'), finish("tool_calls")),
            Reply(text("done\x00here"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed" and run.output == "done\ufffdhere"
    tool = Step.objects.get(run=run, kind="tool")
    assert tool.input == {"reason": "bad\ufffdbyte"} and "bad\ufffdbyte" in tool.error
    assert "\ufffd" in repr(Checkpoint.objects.get(run=run).messages)


# --- lone surrogates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: start_run("basic", {"note": "a\ud800b"}), "payload"),
        (lambda: start_run("basic", {"\udfff": 1}), "payload"),
        (lambda: start_run("basic", "x", thread="t\ud800"), "thread"),
        (lambda: start_run("basic", "x", concurrency_key="k\udc00"), "concurrency_key"),
        (lambda: start_run("basic", "x", id="i\ud83d"), "id"),
        (lambda: start_run("basic", "x", keys={"user": "u\ud800"}), "keys"),
    ],
)
def test_lone_surrogates_from_callers_are_refused_and_create_nothing(call, what):
    with pytest.raises(InvalidPayload, match=f"{what} must not contain .*lone surrogates"):
        call()
    assert not Run.objects.exists() and not Thread.objects.exists()


def test_lone_surrogates_from_the_model_and_tools_are_stored_streamed_and_sent_on_as_replacements(server):
    # The chunks carry them as JSON escapes, which the openai client decodes to lone surrogates; the
    # arguments are JSON text in a JSON string, whose escape our own parse decodes.
    server.script(
        "m-basic",
        [
            Reply(
                text("half \ud83d of a pair"),
                tool_call("c1", "explode", '{"reason": "bad\\ud800byte"}'),
                finish("tool_calls"),
            ),
            Reply(text("done\udfffhere"), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    published = events(run)
    assert run.status == "completed" and run.output == "done\ufffdhere"
    llm = Step.objects.filter(run=run, kind="llm").order_by("index").first()
    assert llm.output["text"] == "half \ufffd of a pair"
    tool = Step.objects.get(run=run, kind="tool")
    assert tool.input == {"reason": "bad\ufffdbyte"} and "bad\ufffdbyte" in tool.error
    deltas = "".join(e["text"] for e in published if e["type"] == "delta" and e["step"] == llm.index)
    assert deltas == llm.output["text"]
    assert "\ufffd" in repr(Checkpoint.objects.get(run=run).messages)
    # The second model call got the tool's error as its result: the request could be encoded.
    assert "bad\ufffdbyte" in json.dumps(server.requests[-1]["messages"], ensure_ascii=False)
