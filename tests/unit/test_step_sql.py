"""The steps' SQL (chamvi_runs.store.step_sql) writes what the ORM wrote: a column the models gain
must not be left out of it."""

from __future__ import annotations

from django.db.models import NOT_PROVIDED

from chamvi_runs.models import Checkpoint, Step
from chamvi_runs.store import step_sql


def _columns(model) -> dict[str, object]:
    return {field.column: field for field in model._meta.concrete_fields}


def test_the_step_insert_writes_every_column_that_has_no_default():
    columns = _columns(Step)
    assert set(step_sql.STEP_COLUMNS) <= columns.keys()
    needed = {
        name
        for name, field in columns.items()
        if not field.primary_key and field.default is NOT_PROVIDED and field.db_default is NOT_PROVIDED
    }
    assert needed <= set(step_sql.STEP_COLUMNS), needed - set(step_sql.STEP_COLUMNS)
    # Those with a default are written too: the SQL sets what the ORM set, not the column's default.
    assert set(step_sql.STEP_COLUMNS) == {c for c, f in columns.items() if not f.primary_key}


def test_the_checkpoint_move_names_columns_of_the_checkpoint():
    assert _columns(Checkpoint).keys() >= step_sql.CHECKPOINT_COLUMNS
