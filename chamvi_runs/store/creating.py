"""Creating runs and threads: inserts that tolerate a concurrent twin."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from ..core.states import Status
from ..models import Run, Thread


def thread_for(name: str, creator: Any, scope: str = "") -> Thread:
    """The thread called ``name`` in ``scope``; created, owned by ``creator`` (None: nobody), if it
    is new.

    Inside the transaction that inserts the thread's run (outside one it raises): the row stays
    locked until that commits, so ``chamvi_prune --threads`` never deletes it under a run being
    started in it. The prune locks the rows it deletes first (SKIP LOCKED, then re-checks that no
    run names them): either it passes this row over, or it commits first and this finds the row
    gone and creates it again for ``creator``, the thread's history having gone with its runs."""
    thread = Thread.objects.select_for_update().filter(scope=scope, name=name).first()
    if thread is not None:
        return thread
    try:
        with transaction.atomic():
            return Thread.objects.create(scope=scope, name=name, owner=creator)
    except IntegrityError:
        # A concurrent first run of the thread won the insert: its creator owns the thread.
        return Thread.objects.select_for_update().get(scope=scope, name=name)


def create_run(**fields: Any) -> tuple[Run, bool]:
    """Insert a queued run; True when this call created it. With a trigger id already used for this
    agent in this scope: the first run, and False."""
    trigger_id = fields.get("trigger_id")
    same = {"agent": fields["agent"], "scope": fields.get("scope", ""), "trigger_id": trigger_id}
    if trigger_id is not None:
        existing = Run.objects.filter(**same).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            return Run.objects.create(status=Status.QUEUED, **fields), True
    except IntegrityError:
        if trigger_id is None:
            raise
        # A concurrent start with the same trigger id won the insert.
        return Run.objects.get(**same), False
