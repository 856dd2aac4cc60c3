"""The decisions of the tool loop, the lease arithmetic and the records' hashes, without a database:
how a run ends (status, error code), which text closes its open tool calls, when it fails for a tool
loop, and when a lease keeper gives up."""

from __future__ import annotations

import json
import secrets

import pytest

from chamvi_runs.core import decisions
from chamvi_runs.core.budget import Budget
from chamvi_runs.core.decisions import ABANDON, FINISH, Settle, Turn
from chamvi_runs.core.lease import LeaseClock
from chamvi_runs.core.messages import answer_open_calls, open_tool_calls, tool_result
from chamvi_runs.core.records import Claim, StepRecord, arguments_hash, hash_token
from chamvi_runs.core.states import TERMINAL, ErrorCode, Status
from chamvi_runs.core.types import ModelTurn, ToolCall

pytestmark = pytest.mark.timeout(10)


def _claim(**fields) -> Claim:
    return Claim(run_id="run_1", owner="worker", attempt=1, resumed=False, **fields)


def _open_call_history() -> list[dict]:
    calls = [ToolCall(id=i, name="refund", arguments="{}").as_message_part() for i in ("c1", "c2")]
    return [
        {"role": "user", "content": "refund order 7"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        tool_result("c1", "looked up"),
    ]


def _closed_with(settle: Settle) -> str:
    """What the model (and a viewer of the history) reads as the result of the call left open."""
    assert settle.close is not None
    closed = answer_open_calls(_open_call_history(), settle.close)
    assert open_tool_calls(closed) == []
    return closed[-1]["content"]


def _fails_with(decision, code: ErrorCode) -> str:
    assert isinstance(decision, Settle)
    assert decision.status is Status.FAILED
    assert decision.error is not None
    assert decision.error[0] == code
    assert decision.error[1], "a failed run always says why"
    return decision.error[1]


# --- on_claim -------------------------------------------------------------------------------------


def test_a_fresh_claim_runs():
    assert decisions.on_claim(_claim(), max_attempts=5) is None


def test_a_cancel_requested_between_executions_ends_the_run_cancelled_before_anything_runs():
    settle = decisions.on_claim(_claim(cancel_requested=True), max_attempts=5)
    assert isinstance(settle, Settle)
    assert settle.status is Status.CANCELLED and settle.error is None
    assert "cancelled" in _closed_with(settle)


def test_executions_dying_unsaved_fail_the_run_at_max_attempts_not_before():
    for stalled in range(5):
        assert decisions.on_claim(_claim(stalled=stalled), max_attempts=5) is None, stalled
    settle = decisions.on_claim(_claim(stalled=5), max_attempts=5)
    message = _fails_with(settle, ErrorCode.TOO_MANY_ATTEMPTS)
    assert "5 executions" in message
    assert "failed" in _closed_with(settle)


def test_a_requested_cancel_wins_over_too_many_attempts():
    settle = decisions.on_claim(_claim(stalled=9, cancel_requested=True), max_attempts=5)
    assert isinstance(settle, Settle) and settle.status is Status.CANCELLED


# --- on_abort and on_refused_wait -----------------------------------------------------------------


def test_no_abort_goes_on():
    assert decisions.on_abort(None) is None


def test_a_lost_lease_writes_nothing():
    assert decisions.on_abort("lease_lost") is ABANDON


def test_a_drain_interrupts_and_leaves_open_calls_for_the_next_worker():
    settle = decisions.on_abort("drain")
    assert isinstance(settle, Settle)
    assert settle.status is Status.INTERRUPTED and settle.status not in TERMINAL
    assert settle.error is None
    # Open tool calls stay open: the worker that resumes the run runs them.
    assert settle.close is None


def test_a_timeout_fails_the_run_and_says_so_to_the_open_calls():
    settle = decisions.on_abort("timeout")
    _fails_with(settle, ErrorCode.TIMEOUT)
    assert "timed out" in _closed_with(settle)


def test_a_cancel_ends_the_run_cancelled_and_says_so_to_the_open_calls():
    settle = decisions.on_abort("cancel")
    assert isinstance(settle, Settle) and settle.status is Status.CANCELLED and settle.error is None
    assert "cancelled" in _closed_with(settle)


def test_a_refused_wait_is_a_cancel():
    settle = decisions.on_refused_wait()
    assert settle.status is Status.CANCELLED and settle.error is None
    assert "cancelled" in _closed_with(settle)


def test_the_close_texts_name_their_cause_distinctly():
    texts = {
        "cancel": _closed_with(decisions.on_abort("cancel")),
        "timeout": _closed_with(decisions.on_abort("timeout")),
        "failed": _closed_with(decisions.budget_gate(Budget(max_steps=1), 1, 0)),
    }
    assert len(set(texts.values())) == 3, texts


# --- budget_gate ----------------------------------------------------------------------------------


def _model_calls_allowed(budget: Budget, tokens_per_call: int = 0) -> tuple[int, Settle]:
    """Model calls made before the gate stops the loop, as the engine counts them."""
    calls = tokens = 0
    while (settle := decisions.budget_gate(budget, calls, tokens)) is None:
        calls += 1
        tokens += tokens_per_call
        assert calls < 1000, "the gate never closed"
    return calls, settle


def test_max_steps_allows_exactly_that_many_model_calls():
    for max_steps in (1, 2, 7):
        calls, settle = _model_calls_allowed(Budget(max_steps=max_steps))
        assert calls == max_steps
        message = _fails_with(settle, ErrorCode.BUDGET_EXCEEDED)
        assert f"max_steps={max_steps}" in message
        assert "failed" in _closed_with(settle)


def test_max_tokens_stops_the_first_call_after_the_tokens_are_used():
    calls, settle = _model_calls_allowed(Budget(max_steps=None, max_tokens=100), tokens_per_call=40)
    assert calls == 3  # 40, 80 are under the budget; 120 is not
    assert "max_tokens=100" in _fails_with(settle, ErrorCode.BUDGET_EXCEEDED)


def test_both_budgets_used_reports_the_steps():
    settle = decisions.budget_gate(Budget(max_steps=2, max_tokens=10), 2, 10)
    assert "max_steps=2" in _fails_with(settle, ErrorCode.BUDGET_EXCEEDED)


def test_an_unlimited_budget_never_stops_the_loop():
    assert decisions.budget_gate(Budget(max_steps=None), 10**6, 10**9) is None


# --- a model turn: classify, finish_reason, broken ------------------------------------------------

CALL = ToolCall(id="call_1", name="refund", arguments='{"order": 7}')


def test_a_complete_answer_without_tool_calls_is_final():
    for reason in ("stop", "length", "content_filter"):
        turn = ModelTurn(text="Done.", finish_reason=reason)
        assert decisions.classify(turn) is Turn.FINAL
        assert decisions.finish_reason(turn) == reason


def test_a_complete_answer_with_tool_calls_runs_them():
    turn = ModelTurn(tool_calls=[CALL], finish_reason="tool_calls")
    assert decisions.classify(turn) is Turn.TOOLS
    assert decisions.finish_reason(turn) == "tool_calls"


def test_a_cut_stream_runs_no_tool_and_fails_incomplete():
    turn = ModelTurn(text="Let me", tool_calls=[CALL], finish_reason=None)
    assert decisions.classify(turn) is Turn.BROKEN
    assert decisions.finish_reason(turn) is None
    step_error, settle = decisions.broken(turn)
    assert _fails_with(settle, ErrorCode.INCOMPLETE_RESPONSE) == step_error
    assert "finish reason" in step_error


def test_an_error_part_fails_model_error_with_the_models_message_even_after_a_finish_reason():
    turn = ModelTurn(text="partial", tool_calls=[CALL], finish_reason="tool_calls", error="rate limited")
    assert decisions.classify(turn) is Turn.BROKEN
    assert decisions.finish_reason(turn) == "error"
    step_error, settle = decisions.broken(turn)
    assert step_error == "rate limited"
    assert _fails_with(settle, ErrorCode.MODEL_ERROR) == "rate limited"


# --- saved_ending: a run that died after saving its last step ends as it would have -------------


def _live_then_saved(turn: ModelTurn):
    """The decision of the live execution, and that of the next one reading the saved step."""
    kind = decisions.classify(turn)
    if kind is Turn.BROKEN:
        step_error, live = decisions.broken(turn)
    else:
        step_error, live = turn.error or "", FINISH
    saved = decisions.saved_ending("assistant", False, decisions.finish_reason(turn), step_error, True)
    return live, saved


@pytest.mark.parametrize(
    "turn",
    [
        ModelTurn(text="The answer.", finish_reason="stop"),
        ModelTurn(text="Trunc", finish_reason="length"),
        ModelTurn(text="half", finish_reason=None),
        ModelTurn(text="", finish_reason=None, tool_calls=[CALL]),
        ModelTurn(text="x", error="upstream 500"),
        ModelTurn(text="x", finish_reason="stop", error="late error"),
    ],
    ids=["stop", "length", "cut", "cut-with-calls", "error", "error-after-finish"],
)
def test_a_recovered_run_settles_as_the_dead_execution_would_have(turn):
    live, saved = _live_then_saved(turn)
    assert saved == live


def test_saved_history_that_does_not_end_the_run_calls_the_model_again():
    # A tool result last: the model has not answered it yet.
    assert decisions.saved_ending("tool", False, "tool_calls", "", True) is None
    # Steering input arrived after the final answer: the model takes it into account.
    assert decisions.saved_ending("assistant", True, "stop", "", True) is None
    # No model step was ever saved (the assistant message came from the thread's history).
    assert decisions.saved_ending("assistant", False, None, "", False) is None
    assert decisions.saved_ending(None, False, None, "", False) is None


# --- invalid_streak and streak_gate: a model stuck on invalid tool calls --------------------------


def _model_call_steps(*valid: bool) -> list[StepRecord]:
    """The steps of one model call as the engine hands them over: the llm step, then its tools."""
    llm = StepRecord(index=0, kind="llm", name="m")
    tools = [StepRecord(index=i + 1, kind="tool", name="t", invalid_call=not v) for i, v in enumerate(valid)]
    return [llm, *tools]


def _fails_at(turns: list[tuple[bool, ...]], limit: int) -> int | None:
    """The model call (1-based) at which the run fails for a tool loop, or None."""
    streak = 0
    for number, valid in enumerate(turns, start=1):
        streak = decisions.invalid_streak(streak, _model_call_steps(*valid))
        if (settle := decisions.streak_gate(streak, limit)) is not None:
            message = _fails_with(settle, ErrorCode.TOOL_LOOP)
            assert str(limit) in message
            return number
    return None


def test_limit_model_calls_in_a_row_of_only_invalid_calls_fail_the_run():
    assert _fails_at([(False,)] * 5, limit=3) == 3
    assert _fails_at([(False, False)] * 5, limit=1) == 1


def test_one_valid_call_resets_the_streak():
    invalid = (False,)
    assert _fails_at([invalid, invalid, (False, True), invalid, invalid], limit=3) is None
    assert _fails_at([invalid, invalid, (True,), invalid, invalid, invalid], limit=3) == 6


def test_a_model_call_without_tool_steps_does_not_count():
    assert decisions.invalid_streak(2, _model_call_steps()) == 0


def test_a_tool_loop_failure_leaves_no_call_open_to_close():
    # Every invalid call was answered with its error: nothing is left for a close text.
    settle = decisions.streak_gate(3, 3)
    assert settle is not None and settle.close is None


# --- idempotency_key ------------------------------------------------------------------------------


def test_idempotency_key_is_stable_across_re_executions_and_unique_per_call():
    runs = [secrets.token_urlsafe(12) for _ in range(3)]
    keys = {
        (run, step, position, name): decisions.idempotency_key(run, step, position, name)
        for run in runs
        for step in (0, 1, 12)
        for position in (0, 1, 2)
        for name in ("refund", "refund_v2")
    }
    assert len(set(keys.values())) == len(keys)
    for (run, step, position, name), key in keys.items():
        assert decisions.idempotency_key(run, step, position, name) == key
        assert key.startswith(f"{run}:{step}:{position}:")


# --- every decision ends a run with a stable error code, or none ---------------------------------


def test_every_settle_decided_carries_an_error_code_exactly_when_it_fails():
    settles = [
        decisions.on_claim(_claim(cancel_requested=True), 1),
        decisions.on_claim(_claim(stalled=1), 1),
        *(decisions.on_abort(reason) for reason in ("drain", "timeout", "cancel")),
        decisions.on_refused_wait(),
        decisions.budget_gate(Budget(max_steps=1), 1, 0),
        decisions.broken(ModelTurn())[1],
        decisions.broken(ModelTurn(error="boom"))[1],
        decisions.saved_ending("assistant", False, "error", "boom", True),
        decisions.saved_ending("assistant", False, None, "cut", True),
        decisions.streak_gate(1, 1),
    ]
    for settle in settles:
        assert isinstance(settle, Settle), settle
        if settle.status is Status.FAILED:
            assert settle.error is not None and settle.error[0] in set(ErrorCode), settle
        else:
            assert settle.error is None, settle


# --- LeaseClock -----------------------------------------------------------------------------------


def _clock(lease=30.0, heartbeat=10.0, cancel_poll=1.0, deadline=None) -> LeaseClock:
    return LeaseClock(lease, heartbeat, cancel_poll, deadline, renewed_at=0.0)


def _keeper(clock: LeaseClock, reachable, until: float) -> tuple[list[float], float | None]:
    """The lease keeper's loop on a simulated clock: the times it renewed, and when it gave up.
    ``reachable(now)`` False is a renewal that raised (the database is away); a renewal the store
    refuses is a lost lease at once, which needs no arithmetic."""
    renewals: list[float] = []
    now = 0.0
    while now < until:
        now += clock.poll
        if clock.renew_due(now):
            if reachable(now):
                clock.renewed(now)
                renewals.append(now)
            elif clock.must_give_up(now):
                return renewals, now
    return renewals, None


def test_the_keeper_polls_for_cancel_at_least_every_heartbeat():
    assert _clock(cancel_poll=1.0).poll == 1.0
    assert _clock(cancel_poll=25.0).poll == 10.0


@pytest.mark.parametrize(("heartbeat", "cancel_poll"), [(10.0, 1.0), (10.0, 3.0), (15.0, 7.0), (15.0, 60.0)])
def test_renewals_keep_the_lease_from_running_out(heartbeat, cancel_poll):
    # HEARTBEAT_SECONDS at most half of LEASE_SECONDS (check E016).
    clock = _clock(lease=30.0, heartbeat=heartbeat, cancel_poll=cancel_poll)
    renewals, gave_up = _keeper(clock, lambda _now: True, until=300.0)
    assert gave_up is None
    assert renewals and renewals[-1] > 300.0 - clock.lease
    gaps = [b - a for a, b in zip([0.0, *renewals], renewals, strict=False)]
    assert all(heartbeat <= gap < clock.lease for gap in gaps), gaps


def test_failing_renewals_are_retried_at_every_poll_then_given_up_before_the_lease_runs_out():
    clock = _clock(lease=30.0, heartbeat=10.0, cancel_poll=1.0)
    attempts: list[float] = []

    def renew(now: float) -> bool:
        attempts.append(now)
        return now < 15.0  # the database goes away after the renewal at 10

    renewals, gave_up = _keeper(clock, renew, until=100.0)
    assert renewals == [10.0]
    assert attempts[1:4] == [20.0, 21.0, 22.0]
    assert gave_up is not None
    assert 10.0 + 0.5 * clock.lease < gave_up < 10.0 + clock.lease


def test_a_renewal_that_succeeds_again_in_time_keeps_the_run():
    clock = _clock(lease=30.0, heartbeat=10.0, cancel_poll=1.0)
    renewals, gave_up = _keeper(clock, lambda now: not 15.0 < now < 30.0, until=100.0)
    assert gave_up is None
    assert renewals[:2] == [10.0, 30.0]


def test_the_deadline():
    assert not _clock().timed_out(10**9)
    clock = _clock(deadline=5.0)
    assert not clock.timed_out(4.99)
    assert clock.timed_out(5.0)


# --- records: arguments_hash and hash_token -------------------------------------------------------


def test_arguments_hash_ignores_key_order_and_whitespace_of_the_models_json():
    a = json.loads('{"order": 7, "refund": {"cents": 500, "reason": "Grüße"}, "tags": ["a", "b"]}')
    b = json.loads('{ "tags" : [ "a","b" ],\n  "refund": {"reason":"Grüße","cents":500},"order":7 }')
    assert arguments_hash(a) == arguments_hash(b)
    # It survives being stored as JSON and read back.
    assert arguments_hash(json.loads(json.dumps(a))) == arguments_hash(a)


@pytest.mark.parametrize(
    "other",
    [
        {"order": 8},
        {"order": "7"},
        {"order": 7.5},
        {"order": True},
        {"order": None},
        {"order": 7, "extra": 1},
        {},
        {"Order": 7},
        {"order": [7]},
    ],
)
def test_arguments_hash_changes_with_any_value(other):
    assert arguments_hash(other) != arguments_hash({"order": 7})


def test_arguments_hash_is_sensitive_to_list_order_and_nested_values():
    assert arguments_hash({"ids": [1, 2]}) != arguments_hash({"ids": [2, 1]})
    assert arguments_hash({"a": {"b": 1}}) != arguments_hash({"a": {"b": 2}})
    assert arguments_hash({"s": "Grüße"}) != arguments_hash({"s": "Grusse"})


def test_hashes_fit_their_64_character_columns_and_do_not_reveal_the_token():
    token = secrets.token_urlsafe(32)
    for digest in (arguments_hash({"order": 7}), hash_token(token)):
        assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    assert token not in hash_token(token)
    assert hash_token(token) == hash_token(token)
    assert hash_token(token) != hash_token(token + "x")
