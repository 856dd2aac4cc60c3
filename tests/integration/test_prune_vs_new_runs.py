"""``chamvi_prune --threads`` racing a new run of a thread it would delete, on two connections of the
real PostgreSQL: in either order the thread stays its owner's, and no one else may join it."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from chamvi_runs import start_run
from chamvi_runs.errors import ThreadForbidden
from chamvi_runs.models import Run, Thread
from tests.integration.test_prune import _age, _run, prune
from tests.support.helpers import execute
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _idle_thread(name: str, owner: Any) -> Run:
    """A thread of ``owner`` idle for 40 days: its row and one settled run with a history."""
    Thread.objects.create(name=name, owner=owner)
    Thread.objects.filter(name=name).update(created_at=Now() - timedelta(days=40))
    old = _run("completed", thread=name, created_by=owner)
    _age([old], days=40)
    return old


def test_a_prune_passes_over_a_thread_whose_owner_is_starting_a_run_in_it(server, django_user_model):
    alice, bob = (django_user_model.objects.create_user(name) for name in ("alice", "bob"))
    old = _idle_thread("t-own", alice)
    started, release = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def start() -> None:
        # start_run inside a transaction of the caller's: the run is inserted, not yet committed.
        try:
            with transaction.atomic():
                result["run"] = start_run("basic", "and now?", thread="t-own", created_by=alice)
                started.set()
                release.wait(20)
        except BaseException as exc:
            result["error"] = exc
        finally:
            connection.close()

    starter = threading.Thread(target=start)
    starter.start()
    try:
        assert started.wait(10)
        prune("--older-than", "30d", "--threads")  # waits for nothing the start holds
    finally:
        release.set()
        starter.join(10)
    assert "error" not in result
    assert Thread.objects.get(name="t-own").owner == alice
    with pytest.raises(ThreadForbidden):
        start_run("basic", "mine now", thread="t-own", created_by=bob)
    # The thread's history stayed with it: alice's new run continues from it.
    assert Run.objects.filter(pk=old.pk).exists()
    server.script("m-basic", [Reply(text("As I said."), finish("stop"))])
    assert execute(result["run"]).status == "completed"
    assert {"role": "assistant", "content": "hi"} in server.requests_for("m-basic")[0]["messages"]


HOLD = 70_517  # the advisory lock the trigger below waits on while the test holds it

_HOLD_DELETE = """
CREATE FUNCTION chamvi_test_hold_thread_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared({hold});
    PERFORM pg_advisory_unlock_shared({hold});
    RETURN NULL;
END $$;
CREATE TRIGGER chamvi_test_hold_thread_delete AFTER DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION chamvi_test_hold_thread_delete();
"""


def _lock_waits(**where: Any) -> bool:
    """Whether a backend waits for a lock: ``objid`` (an advisory lock) or ``pid``."""
    column, value = next(iter(where.items()))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND {column} = %s)", [value])
        return bool(cursor.fetchone()[0])


def test_a_run_started_while_a_prune_deletes_its_thread_keeps_the_thread_its_owners(django_user_model):
    """The prune deleted the thread's row and holds, uncommitted (a trigger waits on a lock the test
    holds), while the owner starts a run in the thread: the start waits for the prune, then makes
    the thread again for its owner."""
    alice, bob = (django_user_model.objects.create_user(name) for name in ("alice", "bob"))
    _idle_thread("t-gone", alice)
    result: dict[str, Any] = {}

    def in_thread(name: str, fn: Any) -> threading.Thread:
        def target() -> None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    result[f"{name}_pid"] = cursor.fetchone()[0]
                result[name] = fn()
            except BaseException as exc:
                result[f"{name}_error"] = exc
            finally:
                connection.close()

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    with connection.cursor() as cursor:
        cursor.execute(_HOLD_DELETE.format(hold=HOLD, table=Thread._meta.db_table))
        cursor.execute("SELECT pg_advisory_lock(%s)", [HOLD])

    def again() -> Run:
        return start_run("basic", "again", thread="t-gone", created_by=alice)

    threads = []
    try:
        threads.append(in_thread("prune", lambda: prune("--older-than", "30d", "--threads")))
        wait_for(lambda: _lock_waits(objid=HOLD), 10, "the prune to hold after deleting the thread's row")
        threads.append(in_thread("start", again))
        wait_for(
            lambda: "start" in result or ("start_pid" in result and _lock_waits(pid=result["start_pid"])),
            10,
            "the start to end or wait for the prune",
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [HOLD])
        for thread in threads:
            thread.join(10)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER chamvi_test_hold_thread_delete ON {Thread._meta.db_table}")
            cursor.execute("DROP FUNCTION chamvi_test_hold_thread_delete()")
    assert not [key for key in result if key.endswith("_error")], result
    assert Thread.objects.get(name="t-gone").owner == alice
    assert Run.objects.get(pk=result["start"].pk).thread == "t-gone"
    with pytest.raises(ThreadForbidden):
        start_run("basic", "mine now", thread="t-gone", created_by=bob)
