"""Thread names are scoped like concurrency keys and trigger ids (issue 18): over HTTP a user's
thread names are their own (``policy().scope(user)``), so nobody can take a predictable name such as
``customer-42`` before its user does; from Python they stay global, on purpose. Against the real
PostgreSQL, with runs executed as a worker would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chamvi_runs import start_run
from chamvi_runs.errors import ThreadForbidden
from chamvi_runs.models import Run, Thread
from chamvi_runs.policy import DefaultPolicy
from chamvi_runs.store import Retention, prune
from tests.integration.test_http_api import RUNS, error_of
from tests.integration.test_websocket import expect_forbidden, headers_for, receive_until_end, socket
from tests.support.helpers import execute, execute_in_thread, logged_in, session_api
from tests.support.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _messages(request: dict) -> str:
    return repr(request["messages"])


def _start(user, thread: str, payload: str) -> dict:
    response = session_api(user).post(RUNS, {"agent": "basic", "payload": payload, "thread": thread})
    assert response.status_code == 201, response.content
    return response.json()


def test_two_users_who_name_the_same_thread_over_http_each_get_their_own(new_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    # Bob takes the name first, as anyone could guess it from our docs.
    server.script("m-basic", [Reply(text("bob squats here"), finish("stop"))])
    bobs = _start(bob, "customer-42", "mine now")
    assert execute(bobs["id"]).status == "completed"

    server.script("m-basic", [Reply(text("alice's order o-77"), finish("stop"))])
    alices = _start(alice, "customer-42", "my order?")
    assert alices["thread"] == "customer-42"
    assert execute(alices["id"]).status == "completed"
    assert "bob squats" not in _messages(server.requests_for("m-basic")[-1])

    # Each continues their own conversation.
    server.script("m-basic", [Reply(text("still yours"), finish("stop"))])
    again = _start(alice, "customer-42", "and now?")
    assert execute(again["id"]).status == "completed"
    seen = _messages(server.requests_for("m-basic")[-1])
    assert "alice's order o-77" in seen and "bob squats" not in seen
    assert sorted(Thread.objects.values_list("name", "owner")) == [
        ("customer-42", alice.pk),
        ("customer-42", bob.pk),
    ]


def test_a_users_run_in_their_thread_waits_only_for_their_own_runs(new_user, server, queue):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    bobs = _start(bob, "t-1", "first")
    alices = _start(alice, "t-1", "first")
    alices_second = _start(alice, "t-1", "second")
    server.script("m-basic", [Reply(text("a"), finish("stop"))])
    # Bob's queued run holds nothing of Alice's thread: her first run is claimed at once...
    assert execute(alices["id"]).status == "completed"
    # ...and her second waited for her first only.
    server.script("m-basic", [Reply(text("b"), finish("stop"))])
    assert execute(alices_second["id"]).status == "completed"
    assert Run.objects.get(pk=bobs["id"]).status == "queued"


def test_python_names_stay_global_and_apart_from_http_names(new_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("from code"), finish("stop"))])
    execute(start_run("basic", "x", thread="support-7", created_by=alice))
    # From Python the name is one global thread, Alice's: Bob may not join it.
    with pytest.raises(ThreadForbidden):
        start_run("basic", "y", thread="support-7", created_by=bob)
    # Over HTTP, Bob's "support-7" is his own thread, which holds none of Alice's history.
    server.script("m-basic", [Reply(text("bob's"), finish("stop"))])
    execute(_start(bob, "support-7", "hello")["id"])
    assert "from code" not in _messages(server.requests_for("m-basic")[-1])


class TeamPolicy(DefaultPolicy):
    """Users of one team share their keys, trigger ids and threads (the docs' example)."""

    def scope(self, user):
        return "team:" + user.username.rstrip("0123456789")


def test_in_a_scope_shared_by_a_team_another_users_thread_is_still_403(new_user, settings, queue):
    settings.CHAMVI_RUNS = {
        **settings.CHAMVI_RUNS,
        "POLICY": "tests.integration.test_thread_scope.TeamPolicy",
    }
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    _start(alice, "t-42", "secret")
    response = session_api(bob).post(RUNS, {"agent": "basic", "payload": "me too", "thread": "t-42"})
    assert response.status_code == 403 and error_of(response)["code"] == "thread_forbidden"
    assert "secret" not in response.content.decode()
    assert Run.objects.filter(created_by=bob).count() == 0


def test_each_user_s_thread_page_shows_their_thread_and_staff_reach_either_by_scope(
    new_user, admin_user, server
):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("for alice"), finish("stop"))])
    alices = _start(alice, "customer-42", "alice asks")
    execute(alices["id"])
    server.script("m-basic", [Reply(text("for bob"), finish("stop"))])
    bobs = _start(bob, "customer-42", "bob asks")
    execute(bobs["id"])

    page = logged_in(alice).get("/chamvi/threads/customer-42/").content.decode()
    assert "alice asks" in page and "bob asks" not in page
    page = logged_in(bob).get("/chamvi/threads/customer-42/").content.decode()
    assert "bob asks" in page and "alice asks" not in page
    # A run's page links its thread; staff, whose own scope has no such thread, with its scope.
    own_page = logged_in(alice).get(f"/chamvi/runs/{alices['id']}/").content.decode()
    assert 'href="/chamvi/threads/customer-42/"' in own_page
    run_page = logged_in(admin_user).get(f"/chamvi/runs/{bobs['id']}/").content.decode()
    link = f'href="/chamvi/threads/customer-42/?scope=user%3A{bob.pk}"'
    assert link in run_page
    staff_view = logged_in(admin_user).get(f"/chamvi/threads/customer-42/?scope=user:{bob.pk}")
    assert "bob asks" in staff_view.content.decode() and "alice asks" not in staff_view.content.decode()
    # Nobody else reaches a thread by naming its scope.
    assert logged_in(alice).get(f"/chamvi/threads/customer-42/?scope=user:{bob.pk}").status_code == 404


def test_a_prune_of_one_users_thread_keeps_the_same_name_of_another(new_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("old"), finish("stop"))])
    old = execute(_start(alice, "t-9", "old")["id"])
    server.script("m-basic", [Reply(text("new"), finish("stop"))])
    execute(_start(bob, "t-9", "new")["id"])
    Run.objects.filter(pk=old.pk).update(created_at=old.created_at.replace(year=2000), finished_at=None)
    Thread.objects.filter(owner=alice).update(created_at=old.created_at.replace(year=2000))
    prune(Retention(older_than=timedelta(days=30), threads=True))
    assert list(Thread.objects.values_list("name", "owner")) == [("t-9", bob.pk)]
    assert not Run.objects.filter(pk=old.pk).exists()


# --- thread sockets --------------------------------------------------------------------------------


def test_each_users_thread_socket_follows_their_own_thread_of_the_name(new_user, admin_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("for alice"), finish("stop"))])
    alices = _start(alice, "customer-42", "alice asks")
    execute(alices["id"])
    bobs_next = _start(bob, "customer-42", "bob asks")
    alices_next = _start(alice, "customer-42", "alice again")
    server.script("m-basic", [Reply(text("for bob"), finish("stop")), Reply(text("alice 2"), finish("stop"))])
    alice_headers, staff_headers = headers_for(alice), headers_for(admin_user)

    async def scenario():
        mine = socket("/ws/chamvi/threads/customer-42/?after=0", alice_headers)
        assert (await mine.connect())[0]
        replayed = await receive_until_end(mine)
        staff = socket(f"/ws/chamvi/threads/customer-42/?after=0&scope=user%3A{bob.pk}", staff_headers)
        assert (await staff.connect())[0]
        assert await staff.receive_nothing(timeout=0.5), "bob's thread has no settled run to replay yet"
        await execute_in_thread(bobs_next["id"])
        await execute_in_thread(alices_next["id"])
        live = await receive_until_end(mine)
        bobs = await receive_until_end(staff)
        await mine.disconnect()
        await staff.disconnect()
        return replayed, live, bobs

    replayed, live, bobs = async_to_sync(scenario)()
    assert {e["run_id"] for e in replayed} == {alices["id"]}
    assert {e["run_id"] for e in live} == {alices_next["id"]}, "bob's run of the same name is not alice's"
    assert {e["run_id"] for e in bobs} == {bobs_next["id"]}


@pytest.mark.parametrize("how", ["http", "code"])
def test_a_socket_opened_before_the_threads_first_run_sees_it_however_it_starts(new_user, server, how):
    alice = new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("first"), finish("stop"))])
    headers = headers_for(alice)

    async def scenario():
        comm = socket("/ws/chamvi/threads/fresh-1/?after=0", headers)
        assert (await comm.connect())[0]
        if how == "http":
            run_id = (await sync_to_async(_start)(alice, "fresh-1", "hello"))["id"]
        else:
            run = await sync_to_async(start_run)("basic", "hello", thread="fresh-1", created_by=alice)
            run_id = run.pk
        await execute_in_thread(run_id)
        live = await receive_until_end(comm)
        await comm.disconnect()
        return run_id, live

    run_id, live = async_to_sync(scenario)()
    assert {e["run_id"] for e in live} == {run_id} and live[-1]["type"] == "run.end"


def test_nobody_else_follows_a_users_thread_by_naming_its_scope(new_user, server):
    alice, bob = new_user("chamvi_runs.add_run"), new_user("chamvi_runs.add_run")
    server.script("m-basic", [Reply(text("for alice"), finish("stop"))])
    execute(_start(alice, "customer-42", "alice asks")["id"])
    headers = headers_for(bob)

    async def scenario():
        comm = socket(f"/ws/chamvi/threads/customer-42/?scope=user%3A{alice.pk}", headers)
        await expect_forbidden(comm)
        await comm.disconnect()

    async_to_sync(scenario)()
