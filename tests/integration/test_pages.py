"""The HTML pages as a user meets them (approvals, a run's chat page, a thread, the demo home, the
admin's link to them), and the events and JSON they are built from: steering inputs shown in the
conversation, decisions with who, when and why, a cancel that closes an approval as cancelled."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin import site as admin_site
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from django.utils import timezone

from chamvi_runs import answer, approve, cancel_run, deny, regenerate, resend, send_input, start_run
from chamvi_runs.models import Run, WaitPoint
from chamvi_runs.policy import DefaultPolicy
from chamvi_runs.streaming.replay import events_from_steps
from tests.support.helpers import admin_url, events, execute, logged_in, make_superuser, make_user
from tests.support.scripted_server import Reply, cut, error_event, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

REFUND = '{"order_id": "o-1", "amount_cents": 500}'
EVIL = "</script><script>alert(1)</script>"


def page(user: Any, path: str) -> str:
    response = logged_in(user).get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


def run_page(user: Any, run: Run) -> str:
    return page(user, f"/chamvi/runs/{run.pk}/")


def element(content: str, id_: str) -> str:
    """The HTML of the element with ``id_`` up to its closing tag (no nesting of the same tag)."""
    found = re.search(rf'<(\w+)[^>]*\bid="{id_}"[^>]*>(.*?)</\1>', content, re.S)
    return found.group(2) if found else ""


def waiting_run(server: Any, owner: Any, arguments: str = REFUND) -> tuple[Run, WaitPoint]:
    call = tool_call("c1", "refund", arguments)
    server.script("m-approving", [Reply(text("Refunding"), call, finish("tool_calls"))])
    run = execute(start_run("approving", "refund please", created_by=owner))
    assert run.status == "waiting"
    return run, WaitPoint.objects.get(run=run)


# --- the run page -----------------------------------------------------------------------------------


def test_a_decided_run_shows_who_decided_when_and_why_and_no_approval_buttons(server):
    owner = make_user("owner")
    approver = make_user("approver", "view_run", "approve_waitpoint")
    run, waitpoint = waiting_run(server, owner)
    waiting = element(run_page(approver, run), "waiting")
    assert "refund" in waiting and 'data-action="approve"' in waiting and 'data-action="deny"' in waiting
    assert 'data-action="approve"' not in element(run_page(owner, run), "waiting"), "owner may not decide"

    approve(waitpoint.approval_id, by=approver, reason="customer is right")
    server.script("m-approving", [Reply(text("Refunded."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    content = run_page(approver, run)
    assert element(content, "waiting").strip() == ""
    assert 'data-action="approve"' not in content
    decisions = element(content, "decisions")
    assert 'class="decision"' in decisions
    for shown in ("approved", "refund", "approver", "customer is right"):
        assert shown in decisions, shown
    decided_at = WaitPoint.objects.get(pk=waitpoint.pk).decided_at
    assert f'datetime="{decided_at.isoformat()}"' in decisions

    body = logged_in(owner).get(f"/chamvi/api/runs/{run.pk}/").json()
    assert body["decisions"] == [
        {
            "approval_id": waitpoint.approval_id,
            "kind": "approval",
            "tool_name": "refund",
            "input": {"order_id": "o-1", "amount_cents": 500},
            "approved_input": None,
            "answer": None,
            "decision": "approved",
            "decided_by": "approver",
            "decided_at": decided_at.isoformat(),
            "reason": "customer is right",
        }
    ]


def test_a_run_cancelled_while_waiting_closes_its_approval_as_cancelled(server):
    owner = make_user("owner", "view_waitpoint")
    owner.is_staff = True
    owner.save()
    run, waitpoint = waiting_run(server, owner)
    assert cancel_run(run.pk) == "cancelled"
    waitpoint.refresh_from_db()
    closed = (waitpoint.decision, waitpoint.decided_by, waitpoint.reason)
    assert closed == ("cancelled", None, "run cancelled")
    content = run_page(owner, run)
    assert element(content, "waiting").strip() == ""
    decisions = element(content, "decisions")
    assert "cancelled" in decisions and "refund" in decisions and "denied" not in decisions
    [end] = [e for e in events(run) if e["type"] == "run.end"]
    assert [(d["decision"], d["tool_name"]) for d in end["decisions"]] == [("cancelled", "refund")]
    # The admin lists it as cancelled, not denied.
    listing = page(owner, "/admin/chamvi_runs/waitpoint/")
    assert re.search(r'<td class="field-decision">\s*Cancelled\s*</td>', listing), listing


def test_controls_show_only_on_an_active_run_its_viewer_may_steer(server):
    owner = make_user("owner")
    viewer = make_user("viewer", "view_run")
    run, _ = waiting_run(server, owner)
    controls = element(run_page(owner, run), "controls")
    assert 'id="input-text"' in controls and 'id="send"' in controls and 'id="cancel"' in controls
    assert 'id="controls"' not in run_page(viewer, run), "a viewer who may neither steer nor cancel"
    cancel_run(run.pk)
    assert 'id="controls"' not in run_page(owner, run)


def test_payloads_are_indented_json_escaped_on_the_run_and_approvals_pages(server):
    approver = make_user("approver", "view_run", "approve_waitpoint")
    arguments = '{"order_id": "' + EVIL.replace("/", "\\/") + '", "amount_cents": 500}'
    server.script("m-approving", [Reply(tool_call("c1", "refund", arguments), finish("tool_calls"))])
    run = execute(start_run("approving", {"message": EVIL}, created_by=approver))
    assert run.status == "waiting"
    for content in (run_page(approver, run), page(approver, "/chamvi/approvals/")):
        assert "<script>alert" not in content
    trigger = element(run_page(approver, run), "trigger")
    escaped = html.escape(EVIL, quote=True)
    assert f"<pre>{{\n  &quot;message&quot;: &quot;{escaped}&quot;\n}}</pre>" in trigger
    approvals = page(approver, "/chamvi/approvals/")
    assert f"&quot;order_id&quot;: &quot;{escaped}&quot;,\n  &quot;amount_cents&quot;: 500" in approvals


def test_pages_link_to_each_other_and_to_the_site(server):
    owner = make_user("owner", "view_run", "approve_waitpoint")
    run, _ = waiting_run(server, owner)
    for content in (run_page(owner, run), page(owner, "/chamvi/approvals/")):
        assert 'id="to-site" href="/"' in content and 'id="to-approvals" href="/chamvi/approvals/"' in content
    assert f'href="/chamvi/runs/{run.pk}/"' in page(owner, "/chamvi/approvals/")


def test_the_approvals_page_says_what_was_decided(server):
    decider = make_user("decider", "view_run", "approve_waitpoint", "cancel_run")
    client = logged_in(decider)
    run, waitpoint = waiting_run(server, decider)
    form = {"action": "deny", "approval_id": waitpoint.approval_id, "reason": "no"}
    content = client.post("/chamvi/approvals/", form, follow=True).content.decode()
    assert f"Denied refund for run {run.pk}." in content and 'class="approval"' not in content
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision == "denied"

    other, _ = waiting_run(server, decider)
    content = client.post("/chamvi/approvals/", {"action": "cancel", "run_id": other.pk}, follow=True)
    assert f"Cancelled run {other.pk}; its approval of refund is cancelled." in content.content.decode()
    # Who cancelled is the decision's author, shown on the run page like any decision.
    closed = WaitPoint.objects.get(run=other)
    assert (closed.decision, closed.decided_by) == ("cancelled", decider)
    assert "decider" in element(run_page(decider, other), "decisions")


# --- threads ----------------------------------------------------------------------------------------


def test_a_thread_page_shows_its_runs_oldest_first_to_those_who_may_view_them(server):
    owner, stranger = make_user("owner"), make_user("stranger")
    thread = "support/ticket 7"
    server.script("m-basic", [Reply(text("Hello Ada."), finish("stop"))])
    first = execute(start_run("basic", "I am Ada", created_by=owner, thread=thread))
    server.script("m-basic", [Reply(text("You are Ada."), finish("stop"))])
    second = execute(start_run("basic", {"message": "Who am I?"}, created_by=owner, thread=thread))

    content = page(owner, "/chamvi/threads/support/ticket%207/")
    runs = re.findall(r'class="thread-run" data-run-id="([^"]+)"', content)
    assert runs == [first.pk, second.pk]
    for shown in ("I am Ada", "Hello Ada.", "You are Ada.", f'href="/chamvi/runs/{second.pk}/"', "completed"):
        assert shown in content, shown
    assert logged_in(stranger).get("/chamvi/threads/support/ticket%207/").status_code == 404
    assert logged_in(owner).get("/chamvi/threads/nobody/").status_code == 404

    # The run page of the second run shows the first above it, and links to the thread.
    content = run_page(owner, second)
    history = content.split('id="thread-history"')[1].split("<h1>")[0]
    assert re.findall(r'data-run-id="([^"]+)"', history) == [first.pk]
    assert "I am Ada" in history and "Hello Ada." in history
    assert 'id="to-thread" href="/chamvi/threads/support/ticket%207/"' in content
    assert 'id="thread-history"' not in run_page(owner, first)


def test_a_run_page_leaves_out_earlier_runs_of_the_thread_its_viewer_may_not_see(server, settings):
    owner, reader = make_user("owner"), make_user("reader", "view_run")
    server.script("m-basic", [Reply(text("one"), finish("stop"))])
    execute(start_run("basic", "first", created_by=owner, thread="t"))
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "POLICY": f"{__name__}.OwnRunsPolicy"}
    server.script("m-basic", [Reply(text("two"), finish("stop"))])
    second = execute(start_run("basic", "second", created_by=owner, thread="t"))
    assert 'id="thread-history"' in run_page(owner, second)
    assert logged_in(reader).get(f"/chamvi/runs/{second.pk}/").status_code == 404


class OwnRunsPolicy:
    """A site policy: users see their own runs and threads only."""

    def can_view(self, user, run):
        return user.is_authenticated and run.created_by_id == user.pk

    can_steer = can_cancel = can_decide = can_view

    def can_view_thread(self, user, thread):
        return user is not None and user.is_authenticated and thread.owner_id == user.pk

    def can_start(self, user, agent):
        return user.is_authenticated

    def scope(self, user):
        return f"user:{user.pk}"


# --- home and admin ---------------------------------------------------------------------------------


def test_the_home_page_lists_the_users_recent_runs(server):
    owner, other = make_user("owner"), make_user("other")
    mine = start_run("basic", "mine", created_by=owner)
    theirs = start_run("basic", "theirs", created_by=other)
    content = page(owner, "/")
    assert f'href="/chamvi/runs/{mine.pk}/"' in content and theirs.pk not in content
    assert 'href="/chamvi/approvals/"' in content


def test_the_admin_run_page_is_read_only_and_links_to_the_run_page(server):
    admin = make_superuser()
    run = start_run("basic", "x", created_by=admin)
    content = page(admin, admin_url(run))
    assert f'href="/chamvi/runs/{run.pk}/"' in content and "View on site" in content
    assert 'name="_save"' not in content and "deletelink" not in content


# --- the events the pages render ----------------------------------------------------------------------


def test_a_steering_input_is_an_event_before_the_model_call_that_takes_it_and_in_the_rebuild(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 1}'), finish("tool_calls")),
            Reply(text("2, and hi"), finish("stop")),
        ],
    )
    run = start_run("basic", "x")
    item = send_input(run.pk, {"note": "also say hi"})
    run = execute(run)
    assert run.status == "completed"
    live = events(run)
    [taken] = [e for e in live if e["type"] == "input"]
    assert {k: taken[k] for k in ("run_id", "step", "input_id", "payload")} == {
        "run_id": run.pk,
        "step": 0,
        "input_id": item.pk,
        "payload": {"note": "also say hi"},
    }
    assert live[live.index(taken) + 1]["type"] == "step.start"
    rebuilt = events_from_steps(run)
    assert [e["type"] for e in rebuilt][:3] == ["run.start", "input", "step.start"]
    assert {k: rebuilt[1][k] for k in ("step", "input_id", "payload")} == {
        "step": 0,
        "input_id": item.pk,
        "payload": {"note": "also say hi"},
    }


@pytest.mark.parametrize("decision", ["approved", "denied"])
def test_the_run_resumes_after_a_decision_with_who_made_it(server, decision):
    approver = make_user("approver", "view_run", "approve_waitpoint")
    run, waitpoint = waiting_run(server, approver)
    (approve if decision == "approved" else deny)(waitpoint.approval_id, by=approver, reason="because")
    server.script("m-approving", [Reply(text("Done."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    decided_at = WaitPoint.objects.get(pk=waitpoint.pk).decided_at.isoformat()
    expected = {
        "approval_id": waitpoint.approval_id,
        "kind": "approval",
        "tool_name": "refund",
        "input": {"order_id": "o-1", "amount_cents": 500},
        "approved_input": None,
        "answer": None,
        "decision": decision,
        "decided_by": "approver",
        "decided_at": decided_at,
        "reason": "because",
    }
    [resume] = [e for e in events(run) if e["type"] == "run.resume"]
    assert resume["decision"] == expected
    # Rebuilt from the stored steps, the run resumes at the same place with the same decision.
    rebuilt = events_from_steps(run)
    [again] = [e for e in rebuilt if e["type"] == "run.resume"]
    assert again["decision"] == expected
    before = [e["type"] for e in rebuilt[: rebuilt.index(again)]]
    assert before == ["run.start", "step.start", "delta", "step.end"]


def test_a_run_resumed_without_a_decision_announces_none(server):
    from chamvi_runs import store

    server.script("m-basic", [Reply(text("hi"), finish("stop"))])
    run = start_run("basic", "x")
    claim = store.claim(run.pk, "dead-worker", 5)
    store.settle(claim, "interrupted")
    run = execute(run)
    [resume] = [e for e in events(run) if e["type"] == "run.resume"]
    assert "decision" not in resume


# --- the approvals page at scale ----------------------------------------------------------------------

TRIGGER_TEXT = "lorem ipsum dolor " * 200  # a trigger of a few KB, which the page must not read


def _open_approvals(count: int, creator: Any = None, start: int = 0, **waitpoint: Any) -> list[Run]:
    """``count`` waiting runs with an open approval each, inserted in bulk (the page reads them; no
    execution is needed), expiring in creation order."""
    now = timezone.now()
    runs = [
        Run(
            agent="approving",
            status="waiting",
            trigger={"id": None, "payload": {"message": TRIGGER_TEXT}, "keys": {}, "thread": None},
            created_by=creator,
        )
        for _ in range(count)
    ]
    Run.objects.bulk_create(runs)
    WaitPoint.objects.bulk_create(
        WaitPoint(
            run=run,
            step_index=1,
            tool_call_id=f"c{n}",
            tool_name="refund",
            input={"order_id": f"o-{start + n}", "amount_cents": 500},
            expires_at=now + timedelta(hours=1, seconds=start + n),
            **waitpoint,
        )
        for n, run in enumerate(runs)
    )
    return runs


def _approvals_page(client: Client, query: str = "") -> tuple[str, list[str]]:
    """The page's HTML and the SQL it ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/chamvi/approvals/{query}")
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


def _rows(content: str) -> list[str]:
    return re.findall(r'<tr class="approval" data-approval-id="[^"]+" data-run-id="([^"]+)"', content)


def test_the_approvals_page_is_paged_and_reads_the_same_few_columns_however_many_runs_wait():
    approver = logged_in(make_user("approver", "approve_waitpoint"))
    asker = make_user("asker")
    first = _open_approvals(60, creator=asker)
    content, sql = _approvals_page(approver)
    assert _rows(content) == [r.pk for r in first[:50]], "the 50 soonest to expire, soonest first"
    assert "60 waiting, page 1 of 2" in content and 'href="?page=2"' in content
    assert "asker" in element(content, "approvals")
    assert len(sql) <= 8, sql
    assert not any('"trigger"' in q or '"output"' in q for q in sql), "no trigger or output is read"
    content, _ = _approvals_page(approver, "?page=2")
    assert _rows(content) == [r.pk for r in first[50:]]

    _open_approvals(500, start=60)
    content, more_sql = _approvals_page(approver)
    assert len(_rows(content)) == 50 and "560 waiting, page 1 of 12" in content
    assert len(more_sql) == len(sql), "as many statements for 560 waiting runs as for 60"
    # A page past the last is the last; one that is not a number, the first.
    assert _rows(_approvals_page(approver, "?page=99")[0]) == _rows(_approvals_page(approver, "?page=12")[0])
    assert _rows(_approvals_page(approver, "?page=%00")[0]) == _rows(content)


def test_a_user_who_may_decide_nothing_is_told_why_and_no_approval_is_read():
    _open_approvals(60)
    viewer = logged_in(make_user("viewer", "view_run"))
    content, sql = _approvals_page(viewer)
    assert _rows(content) == []
    assert "You may not approve or deny tool calls" in element(content, "empty")
    assert "chamvi_runs.approve_waitpoint" in content
    assert not any("chamvi_runs_" in q for q in sql), sql


def test_an_approver_with_nothing_waiting_is_told_so():
    content, _ = _approvals_page(logged_in(make_user("approver", "approve_waitpoint")))
    assert "No run is waiting for a decision you may take." in element(content, "empty")
    assert 'id="pages"' not in content


def test_the_approvals_page_says_who_asked():
    asker = make_user("asker")
    [mine] = _open_approvals(1, creator=asker)
    [codes] = _open_approvals(1, start=1)
    content, _ = _approvals_page(logged_in(make_user("approver", "approve_waitpoint")))
    rows = dict(re.findall(r'data-run-id="([^"]+)".*?<td class="asked-by">(.*?)</td>', content, re.S))
    assert rows[mine.pk].startswith("asker<br>") and "ago" in rows[mine.pk]
    assert "no user (started by code)" in rows[codes.pk]
    assert "approving" in content, "the agent"


class CreatorDecidesPolicy(DefaultPolicy):
    """A site policy that changes only ``can_decide``: a run's creator decides its approvals. It
    inherits a ``decidable`` that would say "none" for users without the permission."""

    def can_decide(self, user, run):
        return user.is_authenticated and run.created_by_id == user.pk


@pytest.mark.parametrize("policy", ["OwnRunsPolicy", "CreatorDecidesPolicy"])
def test_a_policy_that_cannot_filter_in_the_query_is_asked_row_by_row_a_page_at_a_time(settings, policy):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "POLICY": f"{__name__}.{policy}"}
    owner = make_user("owner")
    _open_approvals(50)
    mine = _open_approvals(3, creator=owner, start=50)  # expiring after the others: page 2
    client = logged_in(owner)
    content, _ = _approvals_page(client)
    assert _rows(content) == []
    assert "None of the approvals on this page is yours to decide." in content
    assert 'href="?page=2"' in content and "of 2" not in content, "no count of others' approvals"
    content, _ = _approvals_page(client, "?page=2")
    assert _rows(content) == [r.pk for r in mine] and "Page 2" in content


def test_pages_leave_out_the_site_link_where_the_site_serves_no_home_page(server, settings):
    settings.ROOT_URLCONF = __name__
    owner = make_user("owner", "approve_waitpoint")
    run, _ = waiting_run(server, owner)
    for content in (run_page(owner, run), page(owner, "/chamvi/approvals/")):
        assert 'id="to-site"' not in content
        assert 'id="to-approvals" href="/chamvi/approvals/"' in content


# A site without a home page, as `django-admin startproject` makes one (ROOT_URLCONF of the test above).
urlpatterns = [path("admin/", admin_site.urls), path("chamvi/", include("chamvi_runs.urls"))]


# --- answers that stopped before their end ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "status", "mark"),
    [
        (finish("length"), "completed", "— cut off: the answer reached the model's length limit"),
        (error_event("overloaded"), "failed", "— stopped: the model call failed"),
        (cut(graceful=True), "failed", "— cut off: the model's answer stopped before its end"),
    ],
    ids=["length", "error", "cut"],
)
def test_a_thread_page_marks_an_answer_that_stopped_before_its_end(server, settings, ending, status, mark):
    # A retry would take the next scripted reply.
    openai = {**settings.CHAMVI_RUNS["OPENAI"], "max_retries": 0}
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "OPENAI": openai}
    owner = make_user("owner")
    server.script("m-basic", [Reply(text("All fine."), finish("stop"))])
    execute(start_run("basic", "first", created_by=owner, thread="t"))
    server.script("m-basic", [Reply(text("The answer is forty"), ending)])
    run = execute(start_run("basic", "second", created_by=owner, thread="t"))
    assert run.status == status
    content = page(owner, "/chamvi/threads/t/")
    steps = re.findall(r'<div class="bubble step">(.*?)</div></div>', content, re.S)
    assert len(steps) == 2 and 'class="cut"' not in steps[0], "a complete answer has no mark"
    assert steps[1].endswith(f'<div class="cut">{html.escape(mark, quote=True)}')
    assert "The answer is forty" in steps[1]


# --- questions and edited approvals (issue 19) ------------------------------------------------------


def asking_run(server: Any, owner: Any, *calls: tuple[str, str], agent: str = "asking") -> tuple[Run, list]:
    """A run of ``agent`` whose model asks, in one model call, each (tool, question) of ``calls``."""
    replies = [tool_call(f"c{i}", tool, json.dumps({"question": q})) for i, (tool, q) in enumerate(calls)]
    server.script(f"m-{agent}", [Reply(*replies, finish("tool_calls"))])
    run = execute(start_run(agent, "help me", created_by=owner, thread="ask-1"))
    assert run.status == "waiting"
    return run, list(WaitPoint.objects.filter(run=run).order_by("call_position"))


def test_an_open_question_shows_its_text_and_a_form_to_the_runs_user_only(server):
    owner = make_user("owner")
    approver = make_user("approver", "view_run", "approve_waitpoint")
    run, [question] = asking_run(server, owner, ("ask_user", "Which colour, " + EVIL + "?"))
    assert question.kind == "input"
    content = run_page(owner, run)
    waiting = content.split('id="waiting"')[1].split('id="notice"')[0]
    assert f'data-approval-id="{question.approval_id}"' in waiting and 'data-kind="input"' in waiting
    assert "Which colour, " + html.escape(EVIL) + "?" in waiting and "<script>alert" not in content
    assert 'class="answer-form" data-form="text"' in waiting and 'name="answer"' in waiting
    assert 'data-action="approve"' not in waiting, "a question is answered, not approved"
    assert '"can_answer": true' in content
    # An approver is not the run's user: the question shows, its form does not.
    for_approver = run_page(approver, run)
    assert "Which colour" in for_approver and 'class="answer-form"' not in for_approver
    assert "The run's user must answer it." in for_approver
    # Questions are not approvals: the approvals page leaves them out.
    approvals = page(approver, "/chamvi/approvals/")
    assert question.approval_id not in approvals and 'id="empty"' in approvals
    # The thread page shows it with its form too.
    thread = page(owner, "/chamvi/threads/ask-1/")
    assert f'data-approval-id="{question.approval_id}"' in thread and 'class="answer-form"' in thread
    assert 'data-can-answer="true"' in thread
    assert 'data-can-answer="false"' in page(
        make_user("viewer", "view_run"), "/chamvi/threads/ask-1/?scope=" + run.scope
    )


def test_the_answer_form_follows_the_questions_answer_schema(server):
    owner = make_user("owner")
    run, waits = asking_run(
        server,
        owner,
        ("confirm", "Refund it?"),
        ("choose_shipping", "How should we ship?"),
        ("ask_user", "Anything else?"),
        agent="asking_two",
    )
    assert [w.kind for w in waits] == ["input"] * 3
    waiting = run_page(owner, run).split('id="waiting"')[1].split('id="notice"')[0]
    forms = re.findall(r'<form class="answer-form" data-form="(\w+)">(.*?)</form>', waiting, re.S)
    assert [kind for kind, _ in forms] == ["boolean", "json", "text"], "one form per open question, in order"
    boolean, json_form, text_form = (body for _, body in forms)
    assert 'value="true">Yes</button>' in boolean and 'value="false">No</button>' in boolean
    assert "<textarea" in json_form and "as JSON" in json_form
    assert '<input type="text" name="answer"' in text_form
    for question in ("Refund it?", "How should we ship?", "Anything else?"):
        assert question in waiting


def test_a_choice_is_asked_with_its_choices():
    from chamvi_runs.web.wait_display import answer_form

    form = answer_form({"enum": ["standard", "express", 2], "type": "string"})
    assert form == {
        "kind": "choice",
        "choices": [
            {"value": '"standard"', "label": "standard"},
            {"value": '"express"', "label": "express"},
            {"value": "2", "label": "2"},
        ],
    }
    assert answer_form(None) == {"kind": "json"}
    assert answer_form({"type": "integer"}) == {"kind": "json"}


def test_an_answered_question_is_listed_with_its_answer_and_who_gave_it(server):
    owner = make_user("owner")
    run, [question] = asking_run(server, owner, ("ask_user", "Which colour?"))
    answer(question.approval_id, "deep blue", by=owner)
    server.script("m-asking", [Reply(text("Blue it is."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    content = run_page(owner, run)
    assert element(content, "waiting").strip() == ""
    decisions = content.split('id="decisions"')[1].split("</ul>")[0]
    assert re.search(
        r"<strong>answered</strong>: <span class=\"answer\">deep blue</span> \(ask_user\) by owner", decisions
    ), decisions


def test_an_edited_approval_lists_what_the_approver_changed(server):
    from tests.testapp.models import Refund

    approver = make_user("approver", "view_run", "approve_waitpoint")
    run, waitpoint = waiting_run(server, approver)
    assert 'class="edit-arguments"' in element(run_page(approver, run), "waiting")
    approve(waitpoint.approval_id, by=approver, arguments={"order_id": "o-1", "amount_cents": 200})
    server.script("m-approving", [Reply(text("Refunded 2.00."), finish("stop"))])
    run = execute(run)
    assert run.status == "completed"
    assert list(Refund.objects.values_list("order_id", "amount_cents")) == [("o-1", 200)]
    decisions = run_page(approver, run).split('id="decisions"')[1].split("</ul></div>")[0]
    changes = re.findall(r'<li class="change">(.*?)</li>', decisions)
    assert changes == [
        '<code>amount_cents</code> <span class="before">500</span> &rarr; <span class="after">200</span>'
    ], decisions
    assert "changed before approving" in decisions


def test_the_approvals_page_approves_edited_arguments(server):
    from tests.testapp.models import Refund

    approver = make_user("approver", "view_run", "approve_waitpoint")
    client = logged_in(approver)
    run, waitpoint = waiting_run(server, approver)
    content = page(approver, "/chamvi/approvals/")
    assert '<textarea name="arguments"' in content and "Edit arguments" in content
    post = {"approval_id": waitpoint.approval_id, "action": "approve", "reason": ""}

    for bad, said in (
        ("{not json", "The arguments are not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"order_id": "o-1", "amount_cents": "lots"}', "amount_cents"),
    ):
        shown = client.post("/chamvi/approvals/", {**post, "arguments": bad}, follow=True).content.decode()
        assert said in shown, (bad, shown)
        assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None, "nothing decided"

    edited = '{"order_id": "o-1", "amount_cents": 250}'
    shown = client.post("/chamvi/approvals/", {**post, "arguments": edited}, follow=True).content.decode()
    assert "with your changes" in shown
    stored = WaitPoint.objects.get(pk=waitpoint.pk)
    assert (stored.decision, stored.approved_input) == ("approved", {"order_id": "o-1", "amount_cents": 250})
    server.script("m-approving", [Reply(text("Done."), finish("stop"))])
    assert execute(run).status == "completed"
    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [250]


def test_approving_the_arguments_as_proposed_is_a_plain_approval(server):
    approver = make_user("approver", "view_run", "approve_waitpoint")
    _, waitpoint = waiting_run(server, approver)
    # The textarea as the page drew it, reformatted: the same arguments.
    same = '{"amount_cents": 500,\n "order_id": "o-1"}'
    post = {"approval_id": waitpoint.approval_id, "action": "approve", "arguments": same}
    shown = logged_in(approver).post("/chamvi/approvals/", post, follow=True).content.decode()
    assert "Approved refund for run" in shown and "with your changes" not in shown
    stored = WaitPoint.objects.get(pk=waitpoint.pk)
    assert (stored.decision, stored.approved_input) == ("approved", None)


def test_an_approval_that_may_not_be_edited_has_no_editor(server):
    approver = make_user("approver", "view_run", "approve_waitpoint")
    call = tool_call("c1", "refund", REFUND)
    server.script("m-editing_locked", [Reply(call, finish("tool_calls"))])
    run = execute(start_run("editing_locked", "refund please", created_by=approver))
    waitpoint = WaitPoint.objects.get(run=run)
    assert not waitpoint.editable
    assert 'class="edit-arguments"' not in run_page(approver, run)
    assert 'name="arguments"' not in page(approver, "/chamvi/approvals/")
    post = {
        "approval_id": waitpoint.approval_id,
        "action": "approve",
        "arguments": REFUND.replace("500", "1"),
    }
    shown = logged_in(approver).post("/chamvi/approvals/", post, follow=True).content.decode()
    assert "cannot be changed" in shown
    assert WaitPoint.objects.get(pk=waitpoint.pk).decision is None


# --- branches: regenerate, edit and resend, forks (SPEC §12) ----------------------------------------


def answered(server: Any, agent: str, payload: Any, reply: str, owner: Any, thread: str) -> Run:
    server.script(f"m-{agent}", [Reply(text(reply), finish("stop"))])
    run = execute(start_run(agent, payload, created_by=owner, thread=thread))
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def again(server: Any, new: Run, reply: str) -> Run:
    server.script(f"m-{new.agent}", [Reply(text(reply), finish("stop"))])
    run = execute(new)
    assert run.status == "completed", (run.error_code, run.error_message)
    return run


def sections(content: str) -> list[str]:
    return re.findall(r'class="thread-run" data-run-id="([^"]+)"', content)


def thread_section(content: str, run: Run) -> str:
    return content.split(f'data-run-id="{run.pk}"', 1)[1].split("</section>", 1)[0]


def test_a_thread_page_shows_its_current_branch_and_links_the_runs_left_behind(server):
    owner = make_user("owner", "add_run")
    reader = make_user("reader", "view_run")
    first = answered(server, "basic", "I am Ada", "Hello Ada.", owner, "t-branch")
    second = answered(server, "basic", "Who am I?", "You are Bob.", owner, "t-branch")
    third = answered(server, "basic", "Really?", "Yes, Bob.", owner, "t-branch")
    regenerated = again(server, regenerate(second.pk, by=owner), "You are Ada.")

    content = page(owner, "/chamvi/threads/t-branch/")
    assert sections(content) == [first.pk, regenerated.pk]
    assert "You are Bob." not in content and "Yes, Bob." not in content and "You are Ada." in content
    # The new run says what it replaced; the runs left behind are links, the replaced one to its successor.
    shown = thread_section(content, regenerated)
    assert f'Regenerated from <a class="lineage-link" href="/chamvi/runs/{second.pk}/">' in shown
    left = element(content, "replaced-runs")
    assert re.findall(r'<li data-run-id="([^"]+)"', left) == [second.pk, third.pk]
    assert f'href="/chamvi/runs/{second.pk}/"' in left and f'href="/chamvi/runs/{third.pk}/"' in left
    assert f'replaced by <a class="replaced-by" href="/chamvi/runs/{regenerated.pk}/"' in left
    assert element(content, "replaced-count") == "2"
    # Who may start the agent and steer the run gets Edit and Regenerate, enabled: nothing is active.
    assert shown.count('data-action="edit"') == 1 and shown.count('data-action="regenerate"') == 1
    assert "disabled" not in shown
    assert 'data-payload="&quot;Who am I?&quot;"' in shown
    content = page(reader, "/chamvi/threads/t-branch/")
    assert sections(content) == [first.pk, regenerated.pk]
    assert 'data-action="edit"' not in content and 'data-action="regenerate"' not in content

    # An edited first message: the thread starts over from it, every earlier run is left behind.
    edited = again(server, resend(first.pk, {"message": "I am Cy"}, by=owner), "Hello Cy.")
    content = page(owner, "/chamvi/threads/t-branch/")
    assert sections(content) == [edited.pk]
    assert f'Edited from <a class="lineage-link" href="/chamvi/runs/{first.pk}/">' in content
    left = element(content, "replaced-runs")
    assert re.findall(r'<li data-run-id="([^"]+)"', left) == [first.pk, second.pk, third.pk, regenerated.pk]
    assert "Hello Ada." not in element(content, "thread-runs")


def test_edit_and_regenerate_are_disabled_while_a_run_of_the_thread_is_active(server):
    owner = make_user("owner", "add_run")
    answered(server, "basic", "one", "One.", owner, "t-busy")
    start_run("basic", "two", created_by=owner, thread="t-busy")  # queued, never executed here
    content = page(owner, "/chamvi/threads/t-busy/")
    buttons = re.findall(r"<button[^>]*data-action=\"(?:edit|regenerate)\"[^>]*>", content)
    assert len(buttons) == 4 and all("disabled" in b for b in buttons), buttons


def test_a_run_page_says_what_replaced_it_what_it_replaced_and_where_it_was_forked(server):
    owner = make_user("owner", "add_run")
    first = answered(server, "basic", "I am Ada", "Hello Ada.", owner, "t-lineage")
    second = answered(server, "basic", "Who am I?", "You are Bob.", owner, "t-lineage")
    third = answered(server, "basic", "Really?", "Yes, Bob.", owner, "t-lineage")
    regenerated = again(server, regenerate(second.pk, by=owner), "You are Ada.")

    content = run_page(owner, second)
    notice = element(content, "lineage")
    assert f'Replaced by <a id="replaced-by" href="/chamvi/runs/{regenerated.pk}/">' in notice
    # Left behind without being replaced itself: it says so, and its thread's history is its own.
    content = run_page(owner, third)
    assert "Replaced: an earlier run of the thread was regenerated or edited" in element(content, "lineage")
    history = content.split('id="thread-history"')[1].split("<h1>")[0]
    assert re.findall(r'data-run-id="([^"]+)"', history) == [first.pk, second.pk]
    # The new run goes on from the first only, and has no buttons of the thread page.
    content = run_page(owner, regenerated)
    assert f'Regenerated from <a class="lineage-link" href="/chamvi/runs/{second.pk}/">' in element(
        content, "lineage"
    )
    history = content.split('id="thread-history"')[1].split("<h1>")[0]
    assert re.findall(r'data-run-id="([^"]+)"', history) == [first.pk]
    assert 'data-action="regenerate"' not in history and 'data-action="edit"' not in history
    assert "Replaced by" not in content

    edited = again(server, resend(regenerated.pk, "Who am I, really?", by=owner), "Ada.")
    assert "Edited from" in element(run_page(owner, edited), "lineage")
    server.script("m-basic", [Reply(text("Forked."), finish("stop"))])
    fork = execute(
        start_run("basic", "And now?", created_by=owner, thread="t-lineage", from_step=(first.pk, 0))
    )
    notice = element(run_page(owner, fork), "lineage")
    assert (
        f'Forked from <a class="lineage-link" href="/chamvi/runs/{first.pk}/">{first.pk}</a> at step 0'
        in notice
    )
    # A run of a thread nothing replaced says nothing of it.
    assert 'id="lineage"' not in run_page(owner, first)
