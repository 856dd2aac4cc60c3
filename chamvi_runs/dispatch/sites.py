"""Which site a job belongs to, when the workers of several sites listen on one Redis queue.

Two sites left at the default queue name on one Redis take each other's jobs; a job for a run
that the worker's database does not hold would be a silent no-op, and its own site would wait for
``chamvi_tick`` to ring again. So the doorbell stamps every job with its site, and a worker hands
back, untouched, a job stamped by another site whose run it does not hold (``foreign_site``).

A site is its database, identified by the first migration ever recorded in it (its ``applied``
time, to the microsecond): the same row whatever host name, port or pooler a process reaches it
through, and different for every database ever migrated. A database without that row (tables
built without migrations) is named by its NAME, HOST and PORT instead.

The stamp only speaks when the run is missing: a worker executes any run its database holds,
whatever the stamp (a job enqueued before stamps existed has none), and a job of its own site whose
run was pruned stays the no-op it always was.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

from django.db import Error, connections, router
from django.db.migrations.recorder import MigrationRecorder

from ..models import Run
from ..modes import EXECUTE_RUN

logger = logging.getLogger(__name__)

SITE = "chamvi_site"
"""The job meta key of the fingerprint of the site that enqueued the job."""
DATABASE = "chamvi_database"
"""The job meta key of that site's database NAME, for the error a worker of another site logs."""

_fingerprints: dict[tuple[Any, ...], str] = {}
_reported: set[str] = set()
_lock = threading.Lock()


def _alias() -> str:
    return router.db_for_write(Run)


def fingerprint() -> str:
    """This process's site: 16 hex digits, computed once per database (one query)."""
    alias = _alias()
    settings = connections[alias].settings_dict
    key = (alias, settings.get("NAME"), settings.get("HOST"), settings.get("PORT"))
    with _lock:
        if key in _fingerprints:
            return _fingerprints[key]
    try:
        first = (
            MigrationRecorder(connections[alias])
            .migration_qs.order_by("id")
            .values_list("id", "app", "name", "applied")
            .first()
        )
    finally:
        _hand_back(alias)
    value = hashlib.sha256(repr(first if first is not None else key[1:]).encode()).hexdigest()[:16]
    if first is not None:  # a database not migrated yet is looked at again next time
        with _lock:
            _fingerprints[key] = value
    return value


def stamp() -> dict[str, str]:
    """The job meta the doorbell sends with each job: only the run id is needed to execute it, so a
    database that cannot be asked now costs the stamp, not the job."""
    try:
        site = fingerprint()
    except Error:
        return {}
    return {SITE: site, DATABASE: _database_name()}


def foreign_site(job: Any) -> str | None:
    """The database name of the other site that enqueued ``job``, if the job is another site's:
    stamped by another site, for a run this database does not hold. None: this worker's to run (and
    when the database cannot tell now, the execution finds out what it can do, as ever). The caller
    closes the connection it may have opened (the worker's main thread keeps none)."""
    if getattr(job, "func_name", None) != EXECUTE_RUN.path:
        return None
    meta = job.meta or {}
    site = meta.get(SITE)
    run_id = job.args[0] if job.args else None
    alias = _alias()
    try:
        if site is None or site == fingerprint():
            return None
        if isinstance(run_id, str) and Run.objects.using(alias).filter(pk=run_id).exists():
            return None
    except Error:
        return None
    return str(meta.get(DATABASE) or site)


def report_once(job: Any, queue_name: str, database: str) -> None:
    """Log, once per process and other site, why a job went back to the queue and what fixes it;
    the same site's next jobs only at debug level."""
    with _lock:
        first = database not in _reported
        _reported.add(database)
    logger.log(
        logging.ERROR if first else logging.DEBUG,
        "job %s was enqueued by another site (database %r; this worker's is %r) on queue %r of the "
        "same Redis: it is back on the queue, untouched, for that site's workers. Give each site a "
        'queue of its own (CHAMVI_RUNS["QUEUE"], its RQ_QUEUES entry, `manage.py rqworker <queue>`) '
        "or a Redis database of its own.",
        job.id,
        database,
        _database_name(),
        queue_name,
    )


def _database_name() -> str:
    return str(connections[_alias()].settings_dict.get("NAME", ""))


def _hand_back(alias: str) -> None:
    """A pooled connection goes back to the pool at once: the caller is no execution's thread."""
    connection = connections[alias]
    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()
