"""The pure core: tool-call assembly, the status table, message histories, budgets."""

import itertools
import json
import re
from collections import deque
from pathlib import Path

import pytest

from chamvi_runs.core.budget import Budget
from chamvi_runs.core.messages import (
    answer_open_calls,
    artifact_refs,
    last_assistant_text,
    open_tool_calls,
    tool_result,
    trigger_message,
)
from chamvi_runs.core.states import (
    ACTIVE,
    CLAIMABLE,
    TERMINAL,
    TRANSITIONS,
    ErrorCode,
    Status,
    can_transition,
    sources_of,
)
from chamvi_runs.core.toolcalls import ToolCallAccumulator
from chamvi_runs.core.types import ToolCall

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


def _assemble(*fragments) -> list[ToolCall]:
    acc = ToolCallAccumulator()
    for fragment in fragments:
        acc.add(*fragment)
    return acc.calls(id_prefix="gen_")


# --- ToolCallAccumulator --------------------------------------------------------------------------


def test_indexed_deltas_assemble_in_order():
    calls = _assemble(
        (0, "call_a", "add", ""),
        (0, None, None, '{"a": '),
        (1, "call_b", "lookup", '{"id"'),
        (0, None, None, "1}"),
        (1, None, None, ': "x"}'),
    )
    assert calls == [
        ToolCall(id="call_a", name="add", arguments='{"a": 1}'),
        ToolCall(id="call_b", name="lookup", arguments='{"id": "x"}'),
    ]


def test_missing_index_continues_the_latest_call():
    calls = _assemble(
        (None, "call_a", "add", '{"a"'),
        (None, None, None, ": 1}"),
        (None, "call_b", "add", '{"a"'),
        (None, None, None, ": 2}"),
    )
    assert calls == [
        ToolCall(id="call_a", name="add", arguments='{"a": 1}'),
        ToolCall(id="call_b", name="add", arguments='{"a": 2}'),
    ]


def test_index_zero_for_every_call_with_different_ids_is_two_calls():
    calls = _assemble(
        (0, "call_a", "add", '{"a": 1}'),
        (0, "call_b", "add", '{"a": '),
        (0, None, None, "2}"),
    )
    assert calls == [
        ToolCall(id="call_a", name="add", arguments='{"a": 1}'),
        ToolCall(id="call_b", name="add", arguments='{"a": 2}'),
    ]


def test_a_call_without_any_id_gets_the_prefix_id():
    calls = _assemble(
        (0, None, "add", '{"a": 1}'),
        (1, "call_x", "add", '{"a": 2}'),
        (2, None, "lookup", "{}"),
    )
    assert [c.id for c in calls] == ["gen_0", "call_x", "gen_2"]
    assert len({c.id for c in calls}) == 3


def test_a_name_repeated_on_every_fragment_is_not_doubled():
    calls = _assemble(
        (0, "call_a", "add", '{"a"'),
        (0, "call_a", "add", ": 1"),
        (0, None, "add", "}"),
    )
    assert calls == [ToolCall(id="call_a", name="add", arguments='{"a": 1}')]


def test_a_name_streamed_in_pieces_is_joined():
    calls = _assemble((0, "call_a", "ad", ""), (0, None, "d", "{}"))
    assert calls == [ToolCall(id="call_a", name="add", arguments="{}")]


def test_an_id_arriving_after_the_first_fragment_is_kept():
    calls = _assemble((0, None, "add", '{"a"'), (0, "call_late", None, ": 1}"))
    assert calls == [ToolCall(id="call_late", name="add", arguments='{"a": 1}')]


def test_an_id_repeated_on_every_fragment_with_changing_index_stays_one_call():
    calls = _assemble((0, "call_a", "add", '{"a"'), (None, "call_a", None, ": 1}"))
    assert calls == [ToolCall(id="call_a", name="add", arguments='{"a": 1}')]


def test_no_fragments_no_calls():
    assert ToolCallAccumulator().calls("p_") == []


# --- states ---------------------------------------------------------------------------------------


def test_every_status_is_reachable_from_queued_only_along_the_table():
    reached = {Status.QUEUED: [Status.QUEUED]}
    todo = deque([Status.QUEUED])
    while todo:
        current = todo.popleft()
        for target in TRANSITIONS[current]:
            if target not in reached:
                reached[target] = [*reached[current], target]
                todo.append(target)
    assert set(reached) == set(Status)
    for path in reached.values():
        for a, b in itertools.pairwise(path):
            assert can_transition(a, b)
    # Nothing leads back to queued, and a run never goes from queued straight to a result.
    assert sources_of(Status.QUEUED) == frozenset()
    assert not can_transition(Status.QUEUED, Status.COMPLETED)
    assert not can_transition(Status.QUEUED, Status.FAILED)
    assert not can_transition(Status.WAITING, Status.COMPLETED)
    assert not can_transition(Status.RUNNING, Status.RUNNING)


def test_only_the_three_results_are_terminal_and_they_have_no_exits():
    assert {Status.COMPLETED, Status.FAILED, Status.CANCELLED} == TERMINAL
    assert set(Status) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    for status in TERMINAL:
        assert all(not can_transition(status, target) for target in Status), status


def test_every_active_run_can_be_cancelled():
    for status in ACTIVE:
        assert can_transition(status, Status.CANCELLED), status


def test_only_a_running_execution_completes_waits_or_is_interrupted():
    assert sources_of(Status.COMPLETED) == {Status.RUNNING}
    assert sources_of(Status.INTERRUPTED) == {Status.RUNNING}
    assert sources_of(Status.WAITING) == {Status.RUNNING}


def test_a_claim_leaves_a_run_running():
    # Claiming a running run whose lease is free is no transition; any other claim is one to running.
    assert CLAIMABLE <= ACTIVE
    assert Status.WAITING not in CLAIMABLE
    for status in CLAIMABLE:
        assert status is Status.RUNNING or can_transition(status, Status.RUNNING), status


def test_the_fences_sources_are_the_tables_transitions():
    # The store filters every status write on sources_of(target).
    for target in Status:
        assert sources_of(target) == {s for s in Status if can_transition(s, target)}, target


def _concepts_section(title: str) -> str:
    text = (ROOT / "docs" / "concepts.md").read_text()
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_documented_transitions_are_the_tables():
    statuses = {s.value for s in Status}
    table = _concepts_section("Statuses").split("Statuses move only along", 1)[1]
    documented: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = line.split("|")[1:-1]
        if len(cells) == 2:
            # ``approval_expired`` in the waiting row is an error code, not a status.
            targets = {t for t in re.findall(r"`(\w+)`", cells[1]) if t in statuses}
            for source in re.findall(r"`(\w+)`", cells[0]):
                documented[source] = targets
    assert documented == {s.value: {t.value for t in TRANSITIONS[s]} for s in Status}


def test_the_documented_error_codes_are_the_stored_ones():
    codes = re.findall(r"^\| `(\w+)` \|", _concepts_section("Error codes"), re.M)
    assert sorted(codes) == sorted(code.value for code in ErrorCode)


def test_statuses_are_their_stored_strings():
    assert [s.value for s in Status] == [
        "queued",
        "running",
        "waiting",
        "interrupted",
        "completed",
        "failed",
        "cancelled",
    ]
    assert can_transition("queued", "running")  # values read from the database work too
    assert "completed" in TERMINAL


# --- messages -------------------------------------------------------------------------------------


def test_trigger_message_holds_exactly_source_trigger_and_payload():
    attachments = [
        {"id": "a1", "filename": "invoice.pdf", "media_type": "application/pdf"},
        {"id": "b2", "filename": "photo.png", "media_type": "image/png"},
    ]
    message = trigger_message("email", "received", {"subject": "Grüße", "n": [1, 2]}, attachments)
    assert message["role"] == "user"
    text, *files = message["content"]
    assert text["type"] == "text"
    assert json.loads(text["text"]) == {
        "source": "email",
        "trigger": "received",
        "payload": {"subject": "Grüße", "n": [1, 2]},
    }
    assert "Grüße" in text["text"]  # readable, not \\u-escaped
    assert [part["type"] for part in files] == ["file", "file"]
    assert [part["file"]["file_data"] for part in files] == ["chamvi-artifact:a1", "chamvi-artifact:b2"]
    assert [part["file"]["filename"] for part in files] == ["invoice.pdf", "photo.png"]
    assert artifact_refs([message]) == ["a1", "b2"]


def test_trigger_message_without_attachments_is_one_text_part():
    message = trigger_message("api", "api", None)
    assert len(message["content"]) == 1
    assert json.loads(message["content"][0]["text"]) == {"source": "api", "trigger": "api", "payload": None}
    assert artifact_refs([message, {"role": "assistant", "content": "no parts"}]) == []


def _call(call_id: str, name: str = "add") -> dict:
    return ToolCall(id=call_id, name=name, arguments="{}").as_message_part()


def _history() -> list[dict]:
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1"), _call("c2")]},
        tool_result("c1", "3"),
    ]


def test_open_tool_calls_after_an_assistant_with_two_calls_and_one_result():
    assert open_tool_calls(_history()) == [_call("c2")]


def test_open_tool_calls_in_order_when_none_answered():
    messages = _history()[:3]
    assert [c["id"] for c in open_tool_calls(messages)] == ["c1", "c2"]


def test_open_tool_calls_after_a_user_message_is_empty():
    assert open_tool_calls([*_history(), {"role": "user", "content": "more"}]) == []
    assert open_tool_calls([{"role": "user", "content": "hi"}]) == []
    assert open_tool_calls([]) == []


def test_open_tool_calls_only_look_at_the_last_assistant_message():
    messages = [
        *_history(),
        tool_result("c2", "4"),
        {"role": "assistant", "content": "done"},
    ]
    assert open_tool_calls(messages) == []
    assert open_tool_calls([*_history()[:3], tool_result("c1", "x"), tool_result("c2", "y")]) == []


def test_answer_open_calls_closes_each_open_call():
    messages = _history()[:3]
    closed = answer_open_calls(messages, "cancelled")
    assert len(messages) == 3  # the input is not changed
    assert closed[:3] == messages
    assert closed[3:] == [tool_result("c1", "cancelled"), tool_result("c2", "cancelled")]
    assert open_tool_calls(closed) == []
    assert answer_open_calls(closed, "again") == closed


def test_answer_open_calls_after_a_partial_answer():
    closed = answer_open_calls(_history(), "approval expired")
    assert closed[-1] == {"role": "tool", "tool_call_id": "c2", "content": "approval expired"}
    assert [m.get("tool_call_id") for m in closed if m["role"] == "tool"] == ["c1", "c2"]


def test_last_assistant_text():
    assert last_assistant_text(_history()) == ""
    assert (
        last_assistant_text([*_history(), {"role": "assistant", "content": "The answer."}]) == "The answer."
    )
    assert last_assistant_text([]) == ""


# --- budget ---------------------------------------------------------------------------------------


def test_budget_counters_and_deadline():
    budget = Budget(max_steps=2, max_tokens=100, timeout_ms=1500)
    assert not budget.steps_exhausted(1)
    assert budget.steps_exhausted(2)
    assert not budget.tokens_exhausted(99)
    assert budget.tokens_exhausted(100)
    assert budget.deadline(10.0) == pytest.approx(11.5)
    unlimited = Budget(max_steps=None)
    assert not unlimited.steps_exhausted(10**6)
    assert not unlimited.tokens_exhausted(10**9)
    assert unlimited.deadline(10.0) is None
