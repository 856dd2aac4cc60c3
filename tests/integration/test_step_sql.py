"""On PostgreSQL a save writes its steps, checkpoint and usage with the SQL of
chamvi_runs.store.step_sql: the rows are those the ORM wrote, for a short run (its history written
whole at every save) and a long one (past 40 messages, by parts)."""

from __future__ import annotations

import json

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Checkpoint, EffectRecord, Run, Step
from chamvi_runs.store import step_sql
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

RUN_FIELDS = ("status", "output", "input_tokens", "output_tokens", "model_calls", "stalled_executions")
STEP_FIELDS = ("index", "kind", "name", "input", "output", "error", "messages", "attempt")
CHECKPOINT_FIELDS = (
    "step_index",
    "messages",
    "whole_step",
    "whole_length",
    "length",
    "opening_length",
    "finish_reason",
)


def _rows(server, turns: int) -> dict[str, object]:
    # Two calls a turn: a run's 20 model calls make a history past the 40 messages written whole.
    replies = [
        Reply(
            text(f"Adding {n}."),
            tool_call(f"a{n}", "add", f'{{"a": {n}, "b": 2}}', index=0),
            tool_call(f"b{n}", "add", f'{{"a": {n}, "b": 3}}', index=1),
            finish("tool_calls"),
            usage(9, n),
        )
        for n in range(turns)
    ]
    server.script("m-basic", [*replies, Reply(text("Done."), finish("stop"), usage(9, 3))])
    run = execute(start_run("basic", "x"))
    assert run.status == "completed", (run.error_code, run.error_message)
    return {
        "run": Run.objects.filter(pk=run.pk).values(*RUN_FIELDS).get(),
        "steps": list(Step.objects.filter(run=run).order_by("index").values(*STEP_FIELDS)),
        "checkpoint": Checkpoint.objects.filter(run=run).values(*CHECKPOINT_FIELDS).get(),
        "history": Checkpoint.objects.get(run=run).history(),
    }


@pytest.mark.parametrize("turns", [2, 15], ids=["short", "long"])
def test_the_sql_writes_the_rows_the_orm_wrote(server, monkeypatch, turns):
    assert step_sql.applies()
    by_sql = _rows(server, turns)
    monkeypatch.setattr(step_sql, "applies", lambda: False)
    by_orm = _rows(server, turns)
    assert by_sql == by_orm
    # The trigger, each turn's answer and its two results, the final answer.
    assert by_sql["checkpoint"]["length"] == 3 * turns + 2


def _effects(server) -> list[dict[str, object]]:
    """An effect tool run twice in one run (the second call repeats the first's arguments at another
    place, so it is a record of its own), and its records as stored."""
    arguments = '{"order_id": "o-1", "amount_cents": 250}'
    server.script(
        "m-basic",
        [
            Reply(tool_call("r1", "refund", arguments), finish("tool_calls")),
            Reply(tool_call("r2", "refund", arguments), finish("tool_calls")),
            Reply(text("Refunded twice."), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed", (run.error_code, run.error_message)
    rows = (
        EffectRecord.objects.filter(run=run)
        .order_by("key")
        .values("key", "tool_name", "input", "output", "error")
    )
    # The key names the run (and the tool returns it): compared without it.
    return [json.loads(json.dumps(row).replace(run.pk, "<run>")) for row in rows]


def test_an_effect_tools_records_are_those_the_orm_wrote(server, monkeypatch):
    by_sql = _effects(server)
    monkeypatch.setattr(step_sql, "applies", lambda: False)
    assert _effects(server) == by_sql
    assert [row["output"]["refunded"] for row in by_sql] == [250, 250]  # type: ignore[index]
