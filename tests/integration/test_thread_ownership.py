"""Threads belong to someone: another user cannot join a thread and gets none of its history, a
user who may view every run may, a run never receives history its creator may not view, and two
first runs racing for a thread give it one owner. Against the real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection

from chamvi_runs import start_run
from chamvi_runs.errors import ThreadForbidden
from chamvi_runs.models import Run, Thread
from tests.support.helpers import execute, make_user
from tests.support.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _all_text(request: dict) -> str:
    return repr(request["messages"])


def test_another_user_cannot_join_a_thread_and_gets_none_of_its_history(server):
    alice, bob = make_user("alice"), make_user("bob")
    server.script("m-basic", [Reply(text("alice's secret order o-77"), finish("stop"))])
    first = execute(start_run("basic", "my order?", thread="t-42", created_by=alice))
    assert first.status == "completed"
    assert Thread.objects.get(name="t-42").owner == alice

    with pytest.raises(ThreadForbidden):
        start_run("basic", "show me", thread="t-42", created_by=bob)
    assert Run.objects.filter(created_by=bob).count() == 0
    # Code that starts runs for nobody may not read a user's thread either.
    with pytest.raises(ThreadForbidden):
        start_run("basic", "show me", thread="t-42")

    server.script("m-basic", [Reply(text("again"), finish("stop"))])
    second = execute(start_run("basic", "and now?", thread="t-42", created_by=alice))
    assert second.status == "completed"
    assert "alice's secret" in _all_text(server.requests_for("m-basic")[-1])


def test_a_user_allowed_to_view_every_run_may_join_a_thread(server):
    alice, support = make_user("alice"), make_user("support", "view_run")
    server.script("m-basic", [Reply(text("alice's history"), finish("stop"))])
    execute(start_run("basic", "x", thread="t-7", created_by=alice))
    server.script("m-basic", [Reply(text("support here"), finish("stop"))])
    run = execute(start_run("basic", "y", thread="t-7", created_by=support))
    assert run.status == "completed"
    assert "alice's history" in _all_text(server.requests_for("m-basic")[-1])


def test_a_run_never_receives_history_its_creator_may_not_view(server):
    """Runs written before threads had owners (or by a site that bypassed start_run): the first
    owner named in the table gets only what they may see."""
    alice, bob = make_user("alice"), make_user("bob")
    server.script("m-basic", [Reply(text("alice's secret"), finish("stop"))])
    execute(start_run("basic", "x", thread="legacy", created_by=alice))
    Thread.objects.filter(name="legacy").update(owner=bob)  # as if bob's run came first
    server.script("m-basic", [Reply(text("bob's answer"), finish("stop"))])
    run = execute(start_run("basic", "y", thread="legacy", created_by=bob))
    assert run.status == "completed"
    request = server.requests_for("m-basic")[-1]
    assert "alice's secret" not in _all_text(request)
    assert [m["role"] for m in request["messages"]] == ["system", "user"]


def test_two_first_runs_racing_for_a_thread_give_it_exactly_one_owner():
    alice, bob = make_user("alice"), make_user("bob")
    outcomes: list[str] = []

    def start(user: User) -> None:
        try:
            start_run("basic", "x", thread="contested", created_by=user)
            outcomes.append(user.username)
        except ThreadForbidden:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(u,)) for u in (alice, bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    owner = Thread.objects.get(name="contested").owner
    assert sorted(outcomes) == sorted([owner.username, "refused"])
    assert set(Run.objects.values_list("created_by__username", flat=True)) == {owner.username}
