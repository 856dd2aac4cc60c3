"""Migrations that processes of the previous release survive (docs/deployment.md, "Upgrades").

A site runs ``migrate`` while the old release's web processes and workers still run, then restarts
them. The old code knows nothing of a new column: its INSERTs leave it out, so a new column must be
nullable or carry a default in the database (``db_default``; Django's ``default`` lives in Python
only). A column, table or constraint the old code still uses may not go in the release that stops
using it. Migrations up to ``BASELINE`` predate the first release and are exempt.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader

BASELINE = "0004_stuckrun"
# What the old code would break on: it reads, writes or renames its way into these.
REMOVALS = (
    migrations.RemoveField,
    migrations.RenameField,
    migrations.DeleteModel,
    migrations.RenameModel,
    migrations.AlterModelTable,
)


def _released_after_baseline() -> list[migrations.Migration]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    names = sorted(name for app, name in loader.disk_migrations if app == "chamvi_runs")
    assert BASELINE in names, names
    return [loader.disk_migrations[("chamvi_runs", n)] for n in names if n > BASELINE]


def unsafe_operations(migration: migrations.Migration) -> list[str]:
    """What in ``migration`` breaks a process of the release before it."""
    found = []
    for operation in migration.operations:
        if isinstance(operation, REMOVALS):
            found.append(f"{operation.describe()}: removals wait for the release after the last use")
        elif isinstance(operation, migrations.AddField):
            field: models.Field = operation.field
            if not (field.null or field.has_db_default() or field.many_to_many):
                found.append(f"{operation.describe()}: not null and no db_default")
    return found


def test_every_migration_after_the_first_release_keeps_the_previous_release_working() -> None:
    unsafe = {m.name: problems for m in _released_after_baseline() if (problems := unsafe_operations(m))}
    assert not unsafe, unsafe


def test_the_rule_catches_a_not_null_column_without_a_database_default() -> None:
    migration = migrations.Migration("0099_example", "chamvi_runs")
    migration.operations = [
        migrations.AddField("run", "priority", models.IntegerField(default=0)),
        migrations.AddField("run", "tier", models.IntegerField(db_default=0)),
        migrations.AddField("run", "note", models.TextField(null=True)),
        migrations.RemoveField("run", "thread"),
    ]
    assert [p.split(":")[0] for p in unsafe_operations(migration)] == [
        "Add field priority to run",
        "Remove field thread from run",
    ]
