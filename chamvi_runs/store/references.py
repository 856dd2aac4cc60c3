"""Which artifacts runs reference, for the prune (``pruning``): an artifact no remaining run
references may go."""

from __future__ import annotations

import json
import re
from itertools import chain

from django.db import connection
from django.db.models import QuerySet

from ..core.messages import ARTIFACT_SCHEME
from ..models import Checkpoint, Run, Step

# An artifact id in the JSON text of a history ends with the JSON string that holds it. Both
# Python's re and PostgreSQL's regular expressions read it alike (the scheme has no metacharacter).
REFERENCE = ARTIFACT_SCHEME + r'([^"\\]+)'


def referenced_artifacts(runs: QuerySet[Run]) -> set[str]:
    """Ids of the artifacts that ``runs`` reference: in their trigger's attachments (a run no
    execution started yet) and in their history (what later executions and the thread's next runs
    read): the checkpoint's whole history and the messages of model-call steps (which hold the trigger's
    message). Tool steps, inputs, wait points and effect records hold no reference: tool arguments
    and results and steering inputs reach the model as text, never as file parts."""
    if connection.vendor == "postgresql":
        return _referenced_postgres(runs)
    return scan_references(runs)


def scan_references(runs: QuerySet[Run]) -> set[str]:
    """``referenced_artifacts`` on any database: the histories read one by one, with the regular
    expression PostgreSQL applies in one statement."""
    refs = attached(runs)
    openings = Checkpoint.objects.filter(run__in=runs).values_list("messages", flat=True)
    added = Step.objects.filter(run__in=runs, kind=Step.Kind.LLM, messages__isnull=False)
    for messages in chain(openings.iterator(chunk_size=200), added.values_list("messages", flat=True)):
        refs.update(re.findall(REFERENCE, json.dumps(messages, ensure_ascii=False)))
    return refs


def attached(runs: QuerySet[Run]) -> set[str]:
    refs: set[str] = set()
    for attachments in runs.values_list("trigger__attachments", flat=True).iterator(chunk_size=500):
        if isinstance(attachments, list):
            refs.update(str(a["id"]) for a in attachments if isinstance(a, dict) and "id" in a)
    return refs


def _referenced_postgres(runs: QuerySet[Run]) -> set[str]:
    """One statement: a regular expression over each history's JSON text, and the ids of each
    trigger's attachments. The runs are selected once for both halves (MATERIALIZED: a dry run's
    selection of what would remain is the costly part)."""
    subquery, params = runs.order_by().values("pk").query.sql_with_params()
    checkpoint = connection.ops.quote_name(Checkpoint._meta.db_table)
    step = connection.ops.quote_name(Step._meta.db_table)
    run = connection.ops.quote_name(Run._meta.db_table)
    sql = f"""
        WITH kept (id) AS MATERIALIZED ({subquery})
        SELECT m[1] FROM {checkpoint} c JOIN kept ON kept.id = c.run_id
        CROSS JOIN LATERAL regexp_matches(c.messages::text, %s, 'g') m
        UNION
        SELECT m[1] FROM {step} s JOIN kept ON kept.id = s.run_id
        CROSS JOIN LATERAL regexp_matches(s.messages::text, %s, 'g') m
        WHERE s.kind = 'llm' AND s.messages IS NOT NULL
        UNION
        SELECT a ->> 'id' FROM {run} r JOIN kept ON kept.id = r.id
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE jsonb_typeof(r.trigger -> 'attachments') WHEN 'array' THEN r.trigger -> 'attachments'
            ELSE '[]'::jsonb END) a
        WHERE a ->> 'id' IS NOT NULL
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, REFERENCE, REFERENCE])
        return {row[0] for row in cursor.fetchall()}
