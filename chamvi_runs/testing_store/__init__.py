"""An in-memory twin of the Django store, for tests that run agents without PostgreSQL or Redis (as
procrastinate's ``InMemoryConnector`` is for its jobs). ``InMemoryStore`` satisfies
``core.ports.Store`` with the Django store's rules of ownership (``chamvi_runs.store``): every write
of an execution is fenced on its claim (a stale claim writes nothing), a requested cancel wins over
every write that keeps a run going, a step is recorded once, statuses move only along
``core.states.TRANSITIONS``, and leases and wait points expire by the store's clock, which the test
moves (``advance``)::

    from chamvi_runs.runtime.engine import Execution
    from chamvi_runs.testing_store import InMemoryStore

    store = InMemoryStore()
    run = store.start_run("support", {"question": "Where is my order?"})
    claim = store.claim(run.pk, "worker-1", lease_seconds=30)
    Execution(claim, None, db=store).run()  # the model: CHAMVI_RUNS["MODEL"], a ScriptedModel
    assert store.run(run.pk).status == "completed"

Rows are unsaved model instances (``Run``, ``Step``, ``WaitPoint``, ``RunInput``): what reads
return has the attributes a query's rows have, and no database is touched. Beyond the port, it has
what code outside an execution calls: ``start_run``, ``cancel``, ``add_input``, ``decide``, and
``steps``, ``waitpoints``, ``inputs`` to look at what was written.

An execution still announces through the rest of the app: its settle goes through
``runtime.lifecycle.announce_settled`` and a wait through ``runtime.notifications.notify``, which
read and write the Django store, and its events through the channel layer. A test without servers
replaces those (``tests/unit/test_engine_decisions.py`` shows how). Not mirrored: the effect lock
(an effect tool records its effect through the Django store, in a transaction of its own) and
what waits on row locks (here one write at a time holds the whole store)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .executions import ExecutionWrites
from .steering import Steering


class InMemoryStore(ExecutionWrites, Steering):
    """A ``core.ports.Store`` in memory: hand it to ``runtime.engine.Execution`` (``db=``)."""


if TYPE_CHECKING:
    from ..core.ports import Store

    # mypy proves the port is satisfied, as ``runtime.engine`` does for the Django store.
    _: Store = InMemoryStore()

__all__ = ["InMemoryStore"]
