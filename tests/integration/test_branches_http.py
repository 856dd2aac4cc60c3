"""``GET chamvi/api/threads/<thread>/`` (SPEC §12): a thread's current branch, oldest first, and the
ids of its runs off the branch, after regenerates, resends and forks; who may read it, and in which
scope a name is looked up."""

from __future__ import annotations

from typing import Any

import pytest

from chamvi_runs import regenerate, resend, start_run
from chamvi_runs.models import Run
from tests.integration.test_regenerate import last_sent
from tests.support.helpers import anonymous_api, execute, make_user, session_api
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

MODEL = "m-basic"
SUMMARY = {
    "id",
    "agent",
    "status",
    "payload",
    "output",
    "error",
    "created_at",
    "finished_at",
    "replaces",
    "replaced_by",
    "forked_from",
}


def run_of(server, payload: Any, owner: Any, thread: str = "t", **kwargs: Any) -> Run:
    """A completed run of ``basic`` answering ``<payload> answered``; a Run made elsewhere
    (``kwargs["run"]``) is executed instead of a new one."""
    server.script(MODEL, [Reply(text(f"{payload} answered"), finish("stop"))])
    made = kwargs.pop("run", None) or start_run("basic", payload, thread=thread, created_by=owner, **kwargs)
    run = execute(made)
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def thread_json(user: Any, thread: str = "t", query: str = "") -> dict[str, Any]:
    response = session_api(user).get(f"/chamvi/api/threads/{thread}/{query}")
    assert response.status_code == 200, response.content
    return response.json()


def branch_ids(body: dict[str, Any]) -> list[str]:
    return [run["id"] for run in body["branch"]]


def test_a_thread_lists_its_runs_oldest_first_with_what_each_was_asked_and_answered(server):
    owner = make_user("owner")
    runs = [run_of(server, f"q{n}", owner) for n in range(3)]
    body = thread_json(owner)
    assert (body["thread"], body["scope"], body["owner"]) == ("t", "", owner.pk)
    assert branch_ids(body) == [r.pk for r in runs] and body["replaced"] == []
    assert body["branch_page"] == {"total": 3, "earlier": False}
    first = body["branch"][0]
    assert set(first) == SUMMARY
    assert (first["agent"], first["status"], first["payload"], first["output"]) == (
        "basic",
        "completed",
        "q0",
        "q0 answered",
    )
    assert first["error"] is None and first["finished_at"] and first["created_at"]
    assert (first["replaces"], first["replaced_by"], first["forked_from"]) == (None, None, None)


def test_after_a_regenerate_the_branch_holds_the_new_run_and_the_old_one_is_replaced(server):
    owner = make_user("owner")
    first, old = run_of(server, "q1", owner), run_of(server, "q2", owner)
    new = run_of(server, "q2", owner, run=regenerate(old.pk))
    body = thread_json(owner)
    assert branch_ids(body) == [first.pk, new.pk]
    assert body["replaced"] == [old.pk]
    assert body["branch"][-1]["replaces"] == old.pk and body["branch"][-1]["output"] == "q2 answered"
    assert body["branch_page"] == {"total": 2, "earlier": False}
    # The replaced run stays readable and names what replaced it.
    replaced = session_api(owner).get(f"/chamvi/api/runs/{old.pk}/")
    assert replaced.status_code == 200 and replaced.json()["replaced_by"] == new.pk
    # The thread goes on from the new run.
    after = run_of(server, "q3", owner)
    assert branch_ids(thread_json(owner)) == [first.pk, new.pk, after.pk]


def test_after_a_resend_of_a_run_three_deep_the_runs_after_it_are_off_the_branch(server):
    owner = make_user("owner")
    first, second, third, fourth = (run_of(server, f"q{n}", owner) for n in range(1, 5))
    edited = run_of(server, "q2 edited", owner, run=resend(second.pk, "q2 edited"))
    body = thread_json(owner)
    assert branch_ids(body) == [first.pk, edited.pk]
    assert body["replaced"] == [second.pk, third.pk, fourth.pk]
    assert body["branch"][-1]["payload"] == "q2 edited" and body["branch"][-1]["replaces"] == second.pk
    fifth = run_of(server, "q5", owner)
    body = thread_json(owner)
    assert branch_ids(body) == [first.pk, edited.pk, fifth.pk]
    assert body["replaced"] == [second.pk, third.pk, fourth.pk]
    # What the branch shows is what the model was sent.
    assert last_sent(server) == ["q1", "q1 answered", "q2 edited", "q2 edited answered", "q5"]


def test_a_regenerate_of_a_regenerated_run_is_on_the_branch_without_either_earlier_answer(server):
    owner = make_user("owner")
    first, old = run_of(server, "q1", owner), run_of(server, "q2", owner)
    second = run_of(server, "q2", owner, run=regenerate(old.pk))
    third = run_of(server, "q2", owner, run=regenerate(second.pk))
    assert last_sent(server) == ["q1", "q1 answered", "q2"]
    body = thread_json(owner)
    assert branch_ids(body) == [first.pk, third.pk]
    assert body["replaced"] == [old.pk, second.pk]


def test_a_fork_in_the_thread_goes_on_from_the_run_it_was_forked_from(server):
    owner = make_user("owner")
    server.script(
        MODEL,
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls")),
            Reply(text("3"), finish("stop")),
        ],
    )
    first = execute(start_run("basic", "add", thread="t", created_by=owner))
    second = run_of(server, "q2", owner)
    fork = run_of(server, "what if", owner, from_step=(first.pk, 1))
    body = thread_json(owner)
    assert branch_ids(body) == [first.pk, fork.pk]
    assert body["replaced"] == [second.pk]
    assert body["branch"][-1]["forked_from"] == {"run_id": first.pk, "step": 1}
    assert body["branch"][-1]["replaces"] is None
    from_start = run_of(server, "from the start", owner, from_step=(second.pk, -1))
    assert branch_ids(thread_json(owner)) == [first.pk, from_start.pk]


def test_a_long_branch_lists_its_newest_runs_and_says_there_are_earlier_ones(server):
    owner = make_user("owner")
    first = run_of(server, "q0", owner)
    Run.objects.bulk_create(
        Run(agent="basic", status="completed", trigger={"payload": n}, thread="t", created_by=owner)
        for n in range(200)
    )
    body = thread_json(owner)
    ordered = list(Run.objects.filter(thread="t").order_by("created_at", "id").values_list("pk", flat=True))
    assert ordered[0] == first.pk
    assert body["branch_page"] == {"total": 201, "earlier": True}
    assert branch_ids(body) == ordered[1:]


def test_a_thread_of_another_user_is_404_and_a_viewer_of_every_run_reads_it(server):
    owner = make_user("owner")
    stranger, viewer = make_user("stranger"), make_user("viewer", "chamvi_runs.view_run")
    run = run_of(server, "q", owner)
    for user in (stranger,):
        response = session_api(user).get("/chamvi/api/threads/t/")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert branch_ids(thread_json(viewer)) == [run.pk]
    missing = session_api(owner).get("/chamvi/api/threads/nothing-here/")
    assert missing.status_code == 404
    assert anonymous_api().get("/chamvi/api/threads/t/").status_code in (401, 403)


def test_a_thread_name_is_looked_up_in_the_users_scope_then_the_global_one_or_in_the_named_scope(server):
    owner = make_user("owner", "chamvi_runs.add_run")
    api = session_api(owner)
    server.script(MODEL, [Reply(text("over http"), finish("stop"))])
    response = api.post("/chamvi/api/runs/", {"agent": "basic", "payload": "mine", "thread": "support/1"})
    assert response.status_code == 201, response.content
    mine = execute(response.json()["id"])
    site = run_of(server, "the site's", owner, thread="support/1")
    scope = f"user:{owner.pk}"

    own = thread_json(owner, "support/1")
    assert (own["scope"], branch_ids(own)) == (scope, [mine.pk])
    named = thread_json(owner, "support/1", f"?scope=user:{owner.pk}")
    assert branch_ids(named) == [mine.pk]
    global_ = thread_json(owner, "support/1", "?scope=")
    assert (global_["scope"], branch_ids(global_)) == ("", [site.pk])
    stranger = make_user("stranger")
    refused = session_api(stranger).get(f"/chamvi/api/threads/support/1/?scope={scope}")
    assert refused.status_code == 404
