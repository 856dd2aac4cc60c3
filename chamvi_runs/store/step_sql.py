"""A run's hot path as SQL on PostgreSQL: the writes of every step (the renewal with a model
call's usage before its tools run, the fenced usage update with the next call's count, the steps'
insert, the checkpoint's move or first insert), the final answer's settle, an effect tool's three
statements, and the run row these return. They are what a run writes most, and building them
through the ORM cost several times what PostgreSQL takes to run them (a fenced UPDATE 0.6 ms of
CPU against 0.05-0.1 ms as SQL). Each statement does what the ORM's did, column for column, with
the same fence; other databases take the ORM's (``claims``, ``progress``, ``histories``,
``effects``), and so does every rarer write. ``applies`` is the one switch: the claim's two
statements and a model call's count (``claims``) follow it too.

Every write here but the renewal runs inside a transaction of its caller's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection

from ..core.records import Claim
from ..core.states import Status
from ..core.types import Usage
from ..models import Checkpoint, EffectRecord, Run, RunInput, Step


def applies() -> bool:
    """Whether the hot path's writes are this module's SQL (PostgreSQL), or the ORM's."""
    return connection.vendor == "postgresql"


def run_columns(alias: str = "") -> str:
    """Every column of the run row, in field order, for a ``RETURNING`` (``run_from_row``)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(
        prefix + connection.ops.quote_name(f.column or f.attname) for f in Run._meta.concrete_fields
    )


def run_from_row(values: Sequence[Any]) -> Run:
    """A Run from a row of ``run_columns``, its values converted as the ORM converts them (JSON
    columns arrive as text)."""
    fields = Run._meta.concrete_fields
    converted = []
    for f, value in zip(fields, values, strict=True):
        for converter in f.get_db_converters(connection):
            value = converter(value, None, connection)
        converted.append(value)
    return Run.from_db(connection.alias, [f.attname for f in fields], converted)


def _json(value: Any) -> Any:
    """A JSON column's parameter as the ORM passes it: None is SQL NULL."""
    return None if value is None else connection.ops.adapt_json_value(value, None)


def _update_held(
    claim: Claim, assignments: str, params: list[Any], *, unless_cancelled: bool = False
) -> bool:
    """``fence.update_held`` as SQL: the run row updated only while ``claim`` holds it (running,
    same owner, same attempt) and, with ``unless_cancelled``, no cancel was requested."""
    sql = (
        f"UPDATE {Run._meta.db_table} SET {assignments}"
        " WHERE id = %s AND status = %s AND claim_owner = %s AND attempt = %s"
    )
    if unless_cancelled:
        sql += " AND NOT cancel_requested"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, claim.run_id, Status.RUNNING.value, claim.owner, claim.attempt])
        return bool(cursor.rowcount > 0)


def add_usage(claim: Claim, usage: Usage, *, unless_cancelled: bool) -> bool:
    """The fenced update of a save that changes nothing but the usage. False: the claim is lost (or,
    with ``unless_cancelled``, a cancel was requested); nothing was written."""
    return _update_held(
        claim,
        "input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
        " stalled_executions = 0, updated_at = STATEMENT_TIMESTAMP()",
        [usage.input_tokens, usage.output_tokens],
        unless_cancelled=unless_cancelled,
    )


_USAGE_AND_COUNT = """
WITH held AS (
    UPDATE {run} SET input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,
        model_calls = model_calls + 1, stalled_executions = 0, updated_at = STATEMENT_TIMESTAMP()
    WHERE id = %s AND status = %s AND claim_owner = %s AND attempt = %s
    RETURNING id
)
SELECT i.id, i.payload, i.created_at FROM held
LEFT JOIN {input} i ON i.run_id = held.id AND i.consumed_step IS NULL
ORDER BY i.created_at, i.id
"""


def add_usage_and_count(claim: Claim, usage: Usage) -> list[RunInput] | None:
    """``add_usage`` that also counts the model call made next, and returns the steering inputs
    waiting for it, oldest first (the ones the save takes among them: it marks them after this).
    None: the claim is lost; nothing was written."""
    sql = _USAGE_AND_COUNT.format(run=Run._meta.db_table, input=RunInput._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                usage.input_tokens,
                usage.output_tokens,
                claim.run_id,
                Status.RUNNING.value,
                claim.owner,
                claim.attempt,
            ],
        )
        rows = cursor.fetchall()
    return None if not rows else inputs_of(claim.run_id, rows)


def inputs_of(run_id: str, rows: Sequence[tuple[Any, ...]]) -> list[RunInput]:
    """Steering inputs from ``(id, payload, created_at)`` rows of a LEFT JOIN (an id of None: no
    input). Django has psycopg hand jsonb over as text, which JSONField decodes: so does this."""
    return [
        RunInput(id=pk, run_id=run_id, payload=json.loads(raw), created_at=created_at)
        for pk, raw, created_at in rows
        if pk is not None
    ]


def renew(claim: Claim, lease_seconds: float, usage: Usage) -> bool:
    """``claims.renew``: the lease extended by the database's clock, with the usage of a model call
    whose step is not saved yet (before its tools run). False: the claim is lost."""
    return _update_held(
        claim,
        "claim_expires_at = STATEMENT_TIMESTAMP() + make_interval(secs => %s),"
        " input_tokens = input_tokens + %s, output_tokens = output_tokens + %s",
        [float(lease_seconds), usage.input_tokens, usage.output_tokens],
    )


# The Step columns a save writes (tests/unit/test_step_sql.py: every column without a default).
STEP_COLUMNS = (
    "run_id",
    "index",
    "kind",
    "name",
    "input",
    "output",
    "error",
    "messages",
    "attempt",
    "started_at",
    "finished_at",
)
_JSON_STEP_COLUMNS = {"input", "output", "messages"}


def insert_steps(rows: Sequence[dict[str, Any]]) -> None:
    """One INSERT of the steps (``rows``: a value for each of ``STEP_COLUMNS``). A step index
    recorded already raises IntegrityError, as the ORM's bulk_create did."""
    columns = ", ".join(connection.ops.quote_name(column) for column in STEP_COLUMNS)
    one = "(" + ", ".join(["%s"] * len(STEP_COLUMNS)) + ")"
    params: list[Any] = []
    for row in rows:
        params += [_json(row[c]) if c in _JSON_STEP_COLUMNS else row[c] for c in STEP_COLUMNS]
    sql = f"INSERT INTO {Step._meta.db_table} ({columns}) VALUES {', '.join([one] * len(rows))}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


# The Checkpoint columns a move may set (``histories.move_checkpoint``'s fields).
CHECKPOINT_COLUMNS = frozenset(
    {
        "step_index",
        "length",
        "finish_reason",
        "created_at",
        "messages",
        "whole_step",
        "whole_length",
        "opening_length",
    }
)


def create_checkpoint(run_id: str, step_index: int, fields: dict[str, Any]) -> None:
    """The run's first save: its checkpoint, inserted (as ``histories.move_checkpoint`` would after
    finding none), or moved, in one statement, should one exist at ``step_index`` or before."""
    assert fields.keys() <= CHECKPOINT_COLUMNS, fields.keys() - CHECKPOINT_COLUMNS
    names = list(fields)
    values = [_json(fields[n]) if n == "messages" else fields[n] for n in names]
    quoted = [connection.ops.quote_name(n) for n in names]
    table = Checkpoint._meta.db_table
    sql = (
        f"INSERT INTO {table} (run_id, {', '.join(quoted)}) VALUES (%s, {', '.join(['%s'] * len(names))})"
        f" ON CONFLICT (run_id) DO UPDATE SET {', '.join(f'{q} = EXCLUDED.{q}' for q in quoted)}"
        f" WHERE {table}.step_index <= %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, *values, step_index])


def move_checkpoint(run_id: str, step_index: int, fields: dict[str, Any]) -> bool:
    """The run's checkpoint, if it is at ``step_index`` or before, set to ``fields``. False: the run
    has no checkpoint yet (its first save creates it)."""
    assert fields.keys() <= CHECKPOINT_COLUMNS, fields.keys() - CHECKPOINT_COLUMNS
    names = list(fields)
    values = [_json(fields[n]) if n == "messages" else fields[n] for n in names]
    assignments = ", ".join(f"{connection.ops.quote_name(n)} = %s" for n in names)
    sql = f"UPDATE {Checkpoint._meta.db_table} SET {assignments} WHERE run_id = %s AND step_index <= %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, run_id, step_index])
        return bool(cursor.rowcount > 0)


_SETTLE_WITH_ANSWER = """
UPDATE {run} r SET status = %s, claim_owner = NULL, claim_expires_at = NULL, stalled_executions = 0,
    updated_at = STATEMENT_TIMESTAMP(), output = %s, error_code = %s, error_message = %s,
    finished_at = STATEMENT_TIMESTAMP()
WHERE id = %s AND status = %s AND claim_owner = %s AND attempt = %s{unless_input}
RETURNING {columns}, ARRAY(
    SELECT i.id FROM {input} i WHERE i.run_id = r.id AND i.consumed_step IS NOT NULL
    ORDER BY i.created_at, i.id
)
"""
_UNLESS_INPUT = """
    AND NOT EXISTS (SELECT 1 FROM {input} i WHERE i.run_id = r.id AND i.consumed_step IS NULL)"""


def settle_with_answer(
    claim: Claim, status: Status, output: Any, error_code: str, error_message: str, *, unless_input: bool
) -> Run | None:
    """Inside the transaction of the step that ends the run (``progress.save_and_settle``), after
    that step's fenced write: the terminal settle, fenced, returning the run as it settled with its
    receipt of inputs (``receipt``, for its ``run.end``), so nothing is read after the commit. With
    ``unless_input``, an input no model call took (the run row is locked, and adding an input
    locks it too) keeps the run going: None, nothing written."""
    table = RunInput._meta.db_table
    sql = _SETTLE_WITH_ANSWER.format(
        run=Run._meta.db_table,
        input=table,
        columns=run_columns("r"),
        unless_input=_UNLESS_INPUT.format(input=table) if unless_input else "",
    )
    params = [
        status.value,
        _json(output),
        error_code,
        error_message,
        claim.run_id,
        Status.RUNNING.value,
        claim.owner,
        claim.attempt,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    run = run_from_row(row[:-1])
    run.receipt = list(row[-1])
    return run


# An effect tool's statements (``store.effects``): each effect tool runs them in its transaction.


def holds(claim: Claim) -> bool:
    """Whether ``claim`` still holds the run (``fence.held``), read without a lock."""
    sql = (
        f"SELECT 1 FROM {Run._meta.db_table}"
        " WHERE id = %s AND status = %s AND claim_owner = %s AND attempt = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [claim.run_id, Status.RUNNING.value, claim.owner, claim.attempt])
        return cursor.fetchone() is not None


_RECORD_COLUMNS = ("id", "run_id", "key", "tool_name", "input", "output", "error", "created_at")


def effect_record(run_id: str, key: str) -> EffectRecord | None:
    """``effects.effect_record``: the record of ``key``, its JSON columns decoded as the ORM's."""
    columns = ", ".join(connection.ops.quote_name(c) for c in _RECORD_COLUMNS)
    sql = f"SELECT {columns} FROM {EffectRecord._meta.db_table} WHERE run_id = %s AND key = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, key])
        row = cursor.fetchone()
    if row is None:
        return None
    values = dict(zip(_RECORD_COLUMNS, row, strict=True))
    for name in ("input", "output"):
        values[name] = None if values[name] is None else json.loads(values[name])
    return EffectRecord(**values)


def record_effect(fields: dict[str, Any]) -> None:
    """``effects.record_effect``'s INSERT (``fields``: run_id, key, tool_name, input, output,
    error). A key recorded already raises IntegrityError, as the ORM's did."""
    names = [*fields, "created_at"]
    values = [_json(fields[n]) if n in ("input", "output") else fields[n] for n in fields]
    columns = ", ".join(connection.ops.quote_name(n) for n in names)
    marks = ", ".join(["%s"] * len(fields) + ["STATEMENT_TIMESTAMP()"])
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EffectRecord._meta.db_table} ({columns}) VALUES ({marks})", values)
