"""The admin is read-only; runs change only through actions, gated by permissions."""

from __future__ import annotations

import html
import json
import re
import secrets

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chamvi_runs import answer as api_answer
from chamvi_runs import approve as api_approve
from chamvi_runs import start_run
from chamvi_runs.models import ApiToken, Checkpoint, EffectRecord, Run, RunInput, Step, Thread, WaitPoint
from chamvi_runs.store import hash_token
from tests.support.helpers import admin_url, bearer, execute, logged_in, make_superuser, make_user
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


APP = "chamvi_runs"
RUN_STATE = [Run, Step, Checkpoint, WaitPoint, RunInput, EffectRecord, Thread]


def _staff(*perms: str, username: str = "staff") -> Client:
    return logged_in(make_user(username, *perms, is_staff=True))


def _snapshot() -> dict[str, list[dict]]:
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in RUN_STATE}


def _waiting(server) -> Run:
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 5}'), finish("tool_calls"))],
    )
    run = execute(start_run("approving", "x"))
    assert run.status == "waiting"
    return run


def test_runs_are_read_only_in_the_admin(monkeypatch):
    # Ids are token_urlsafe: "_3A" in one is the admin URL escape of ":" (it once got a 302 in CI).
    monkeypatch.setattr(secrets, "token_urlsafe", lambda nbytes: "3A_2Fx")
    run = start_run("basic", "x")
    assert run.pk == "run_3A_2Fx"
    client = _staff("view_run", "change_run")
    page = client.get(admin_url(run))
    assert page.status_code == 200
    assert b'name="status"' not in page.content, "no editable status field"
    assert client.get("/admin/chamvi_runs/run/add/").status_code == 403


def test_the_cancel_action_needs_the_cancel_permission():
    run = start_run("basic", "x")
    changer = _staff("view_run", "change_run", username="changer")
    assert 'value="cancel_runs"' not in changer.get("/admin/chamvi_runs/run/").content.decode()
    changer.post("/admin/chamvi_runs/run/", {"action": "cancel_runs", "_selected_action": [run.pk]})
    assert Run.objects.get(pk=run.pk).status == "queued"

    canceller = _staff("view_run", "cancel_run", username="canceller")
    assert 'value="cancel_runs"' in canceller.get("/admin/chamvi_runs/run/").content.decode()
    response = canceller.post(
        "/admin/chamvi_runs/run/", {"action": "cancel_runs", "_selected_action": [run.pk]}, follow=True
    )
    assert response.status_code == 200
    assert Run.objects.get(pk=run.pk).status == "cancelled"


@pytest.fixture(params=["staff with every chamvi_runs permission", "superuser"])
def mighty(request) -> Client:
    if request.param == "superuser":
        return logged_in(make_superuser())
    return _staff(*Permission.objects.filter(content_type__app_label=APP).values_list("codename", flat=True))


def test_no_change_form_delete_or_add_in_the_admin_writes_run_state(server, mighty):
    run = _waiting(server)
    waitpoint, checkpoint = WaitPoint.objects.get(run=run), Checkpoint.objects.get(run=run)
    before = _snapshot()
    assert before["Step"] and before["Checkpoint"] and before["WaitPoint"]

    forms = {
        run: {
            "status": "completed",
            "claim_owner": "admin",
            "attempt": 0,
            "_save": "Save",
            # The inlines' management forms, each deleting its first row.
            "steps-TOTAL_FORMS": 1,
            "steps-INITIAL_FORMS": 1,
            "steps-0-id": Step.objects.filter(run=run).first().pk,
            "steps-0-run": run.pk,
            "steps-0-DELETE": "on",
            "waitpoints-TOTAL_FORMS": 1,
            "waitpoints-INITIAL_FORMS": 1,
            "waitpoints-0-id": waitpoint.pk,
            "waitpoints-0-run": run.pk,
            "waitpoints-0-DELETE": "on",
        },
        waitpoint: {"decision": "approved", "reason": "admin", "_save": "Save"},
        checkpoint: {"step_index": 0, "messages": "[]", "_save": "Save"},
    }
    for obj, form in forms.items():
        change = admin_url(obj)
        page = mighty.get(change)
        assert page.status_code == 200 and b'name="_save"' not in page.content, change
        assert mighty.post(change, form).status_code == 403, change
        delete = admin_url(obj, "delete")
        assert mighty.get(delete).status_code == 403, delete
        assert mighty.post(delete, {"post": "yes"}).status_code == 403, delete
    for model, pk in (("run", run.pk), ("waitpoint", waitpoint.pk), ("checkpoint", checkpoint.pk)):
        changelist = f"/admin/chamvi_runs/{model}/"
        assert 'value="delete_selected"' not in mighty.get(changelist).content.decode(), model
        mighty.post(changelist, {"action": "delete_selected", "_selected_action": [pk], "post": "yes"})
        assert mighty.get(f"{changelist}add/").status_code == 403, model
    assert _snapshot() == before


def test_approve_actions_need_the_approve_permission(server):
    run = _waiting(server)
    viewer = _staff("view_run", "change_run", "view_waitpoint")
    actions = viewer.get("/admin/chamvi_runs/waitpoint/").content.decode()
    assert 'value="approve"' not in actions
    viewer.post("/admin/chamvi_runs/run/", {"action": "approve_open", "_selected_action": [run.pk]})
    assert WaitPoint.objects.get(run=run).decision is None

    user = make_user("approver", "view_waitpoint", "approve_waitpoint", is_staff=True)
    approver = logged_in(user)
    waitpoint = WaitPoint.objects.get(run=run)
    approver.post("/admin/chamvi_runs/waitpoint/", {"action": "approve", "_selected_action": [waitpoint.pk]})
    waitpoint.refresh_from_db()
    assert waitpoint.decision == "approved" and waitpoint.decided_by == user
    assert Run.objects.get(pk=run.pk).status == "running"
    server.script("m-approving", [Reply(text("done"), finish("stop"))])
    assert execute(run).status == "completed"


def test_an_api_token_created_in_the_admin_is_shown_once_and_stored_hashed():
    admin = make_superuser()
    client = logged_in(admin)
    response = client.post("/admin/chamvi_runs/apitoken/add/", {"user": admin.pk, "name": "ci"}, follow=True)
    message = next(str(m) for m in response.context["messages"])
    raw = message.rsplit(" ", 1)[-1]
    token = ApiToken.objects.get(name="ci")
    assert raw.startswith("chv_") and token.token_hash == hash_token(raw)
    assert raw not in str(list(ApiToken.objects.values()))
    assert Client().get("/chamvi/api/runs/nope/", headers=bearer(raw)).status_code == 404


def test_staff_mint_api_tokens_for_themselves_only():
    root = make_superuser()
    minter = _staff("add_apitoken", "view_apitoken", username="minter")
    form = minter.get("/admin/chamvi_runs/apitoken/add/").content.decode()
    assert 'name="user"' not in form, "no choice of whom the token acts as"
    response = minter.post("/admin/chamvi_runs/apitoken/add/", {"user": root.pk, "name": "as root"})
    assert response.status_code == 302
    token = ApiToken.objects.get(name="as root")
    assert token.user.username == "minter"
    assert not ApiToken.objects.filter(user=root).exists()

    # A superuser may mint for anyone; the staff user does not even see that token.
    superuser = logged_in(root)
    superuser.post("/admin/chamvi_runs/apitoken/add/", {"user": root.pk, "name": "root's"})
    assert ApiToken.objects.get(name="root's").user == root
    listing = minter.get("/admin/chamvi_runs/apitoken/").content.decode()
    assert "as root" in listing and "root&#x27;s" not in listing and "root's" not in listing


# --- what the lists and a run's page show -------------------------------------------------------------

EVIL = "</td><script>alert(1)</script>"
LONG = "word " * 100


def _sql(client: Client, path: str) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, path
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


def cell(row: str, field: str) -> str:
    """The text of a row's ``field`` column, as a read-only inline or list shows it."""
    found = re.search(rf'<td class="field-{field}">\s*<p>(.*?)</p>', row, re.S)
    assert found, (field, row)
    return found.group(1)


def test_a_runs_steps_show_their_content_escaped_and_their_times_to_the_second(server):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls")),
            Reply(tool_call("c2", "explode", "{}"), finish("tool_calls")),
            Reply(text(EVIL + LONG), finish("stop")),
        ],
    )
    run = execute(start_run("basic", "x"))
    assert run.status == "completed"
    client = logged_in(make_superuser())
    content = client.get(admin_url(run)).content.decode()
    rows = re.findall(r'<tr class="form-row has_original"\s+id="steps-\d+">(.*?)</tr>', content, re.S)
    cells = [cell(row, "content") for row in rows]
    assert cells[0] == "→ add()"
    assert cells[1] == "{ &quot;a&quot;: 1, &quot;b&quot;: 2 } → 3"
    assert cells[3].startswith("{} → error: invalid call: invalid arguments for explode")
    assert cells[4].startswith(html.escape(EVIL)) and cells[4].endswith("word word…")
    assert "<script>alert" not in content
    step = Step.objects.get(run=run, index=4)
    assert cell(rows[4], "started") == timezone.localtime(step.started_at).strftime("%Y-%m-%d %H:%M:%S")
    assert re.fullmatch(r"\d+ ms|\d+\.\d{3} s", cell(rows[4], "took")), "to the millisecond"
    # The step's own page shows its text whole.
    link = re.search(r'href="(/admin/chamvi_runs/step/\d+/change/[^"]*)"', rows[4])
    assert link, rows[4]
    whole = client.get(html.unescape(link.group(1))).content.decode()
    assert html.escape(json.dumps(EVIL + LONG)[1:-1]) in whole or html.escape(EVIL + LONG) in whole


def test_a_run_of_10000_steps_shows_its_latest_50_and_links_to_all_of_them_a_page_at_a_time():
    run = start_run("basic", "x")
    started = timezone.now()
    Step.objects.bulk_create(
        Step(run=run, index=i, kind="llm", name="m", output={"text": f"step #{i}."}, started_at=started)
        for i in range(10_000)
    )
    client = logged_in(make_superuser())
    content = client.get(admin_url(run)).content.decode()
    assert len(re.findall(r'id="steps-\d+"', content)) == 50
    assert "step #9950." in content and "step #9999." in content and "step #9949." not in content
    all_steps = f"/admin/chamvi_runs/step/?run={run.pk}"
    assert f'The latest 50 of 10000 steps: <a href="{html.escape(all_steps)}">all 10000' in content
    listing, sql = _sql(client, all_steps)
    assert "step #0." in listing and "step #99." in listing and "step #100." not in listing
    assert len([q for q in sql if "COUNT(" in q]) == 1, "the page's count only, never the whole table's"


def test_the_lists_read_only_the_columns_they_show_and_no_distinct_values(server):
    run = _waiting(server)
    client = logged_in(make_superuser())
    for model in ("run", "waitpoint", "checkpoint", "stuckrun"):
        content, sql = _sql(client, f"/admin/chamvi_runs/{model}/")
        read = " ".join(sql)
        for heavy in ('"trigger"', '"output"', '"messages"', '"chamvi_runs_waitpoint"."input"'):
            assert heavy not in read, (model, heavy)
        assert "DISTINCT" not in read, (model, sql)
    content, _ = _sql(client, "/admin/chamvi_runs/run/")
    assert run.pk in content and 'href="?agent=approving"' in content, (
        "the agent filter lists registered agents"
    )


# --- questions and edited approvals (issue 19) ------------------------------------------------------


def _asked(server, owner=None) -> WaitPoint:
    server.script(
        "m-asking",
        [Reply(tool_call("c1", "ask_user", '{"question": "Which colour?"}'), finish("tool_calls"))],
    )
    run = execute(start_run("asking", "x", created_by=owner))
    assert run.status == "waiting"
    return WaitPoint.objects.get(run=run)


def _field(content: str, name: str) -> str:
    """The text of a read-only field on an object's admin page."""
    found = re.search(
        rf'<div class="[^"]*\bfield-{name}\b(?!_)[^"]*">.*?<div class="readonly">(.*?)</div>', content, re.S
    )
    assert found, (name, content[:3000])
    return html.unescape(found.group(1)).strip()


def test_a_question_shows_its_kind_text_and_answer_in_the_admin(server):
    owner = make_user("owner")
    question = _asked(server, owner)
    client = logged_in(make_superuser())
    listing = client.get("/admin/chamvi_runs/waitpoint/").content.decode()
    assert re.search(r'<td class="field-kind">\s*Input\s*</td>', listing), listing
    assert "?kind__exact=input" in listing, "a filter by kind"
    content = client.get(admin_url(question)).content.decode()
    assert _field(content, "kind") == "Input"
    assert _field(content, "question_text") == "Which colour?"
    assert _field(content, "answer") == "-"

    api_answer(question.approval_id, "navy", by=owner)
    content = client.get(admin_url(question)).content.decode()
    assert _field(content, "answer") == '"navy"'
    assert _field(content, "decision") == "Answered"
    # The run's inline shows the same, on one line.
    inline = client.get(admin_url(question.run)).content.decode()
    [row] = re.findall(r'<tr class="form-row has_original"\s+id="waitpoints-\d+">(.*?)</tr>', inline, re.S)
    assert cell(row, "kind") == "Input"
    assert cell(row, "question_text") == "Which colour?"
    assert cell(row, "answer_shown") == "navy"


def test_an_edited_approval_shows_both_arguments_and_what_changed_in_the_admin(server):
    run = _waiting(server)
    waitpoint = WaitPoint.objects.get(run=run)
    approver = make_superuser()
    api_approve(waitpoint.approval_id, by=approver, arguments={"order_id": "o", "amount_cents": 2})
    client = logged_in(approver)
    content = client.get(admin_url(waitpoint)).content.decode()
    assert json.loads(_field(content, "input")) == {"order_id": "o", "amount_cents": 5}
    assert json.loads(_field(content, "approved_input")) == {"order_id": "o", "amount_cents": 2}
    assert _field(content, "what_changed") == "amount_cents 5 → 2"
    # In the page's order: the proposal, what was approved, what changed.
    assert (
        content.index("field-input")
        < content.index("field-approved_input")
        < content.index("field-what_changed")
    )
    inline = client.get(admin_url(run)).content.decode()
    [row] = re.findall(r'<tr class="form-row has_original"\s+id="waitpoints-\d+">(.*?)</tr>', inline, re.S)
    assert html.unescape(cell(row, "what_changed")) == "amount_cents 5 → 2"
    assert cell(row, "kind") == "Approval"


def test_the_approve_actions_refuse_to_approve_a_question(server):
    owner = make_user("owner")
    question = _asked(server, owner)
    approver = _staff("view_waitpoint", "view_run", "approve_waitpoint", username="approver")
    for action in ("approve", "deny"):
        response = approver.post(
            "/admin/chamvi_runs/waitpoint/",
            {"action": action, "_selected_action": [question.pk]},
            follow=True,
        )
        said = html.unescape(response.content.decode())
        assert f"{question.approval_id} is a question (ask_user), not an approval" in said, action
        assert WaitPoint.objects.get(pk=question.pk).decision is None
    response = approver.post(
        "/admin/chamvi_runs/run/",
        {"action": "approve_open", "_selected_action": [question.run_id]},
        follow=True,
    )
    assert "is a question (ask_user)" in html.unescape(response.content.decode())
    assert WaitPoint.objects.get(pk=question.pk).decision is None
    assert Run.objects.get(pk=question.run_id).status == "waiting"


def test_a_runs_admin_page_links_the_runs_it_replaces_was_replaced_by_and_was_forked_from(server):
    from chamvi_runs import regenerate, resend

    root = make_superuser()
    server.script("m-basic", [Reply(text("Hello."), finish("stop"))])
    first = execute(start_run("basic", "hi", created_by=root, thread="t-admin"))
    again = regenerate(first.pk, by=root)
    edited = resend(first.pk, "hello", by=root)
    fork = start_run("basic", "and?", created_by=root, thread="t-admin", from_step=(first.pk, 0))
    client = logged_in(root)

    def link(run: Run) -> str:
        return f'<a href="{admin_url(run)}">{run.pk}</a>'

    content = client.get(admin_url(first)).content.decode()
    assert _field(content, "replaces_run") == "-"
    # Newest first.
    assert _field(content, "replaced_by_runs") == f"{link(edited)}, {link(again)}"
    assert _field(content, "forked_from_run") == "-"
    content = client.get(admin_url(again)).content.decode()
    assert _field(content, "replaces_run") == link(first)
    assert _field(content, "replaced_by_runs") == "-"
    # A regenerate's history starts where its replaced run's did: that is no fork.
    assert _field(content, "forked_from_run") == "-"
    content = client.get(admin_url(fork)).content.decode()
    assert _field(content, "forked_from_run") == f"{link(first)} at step 0"
    assert _field(content, "replaces_run") == "-"
    # Read-only, next to the thread, and no raw columns of them.
    assert content.index("field-thread") < content.index("field-replaces_run") < content.index("field-output")
    assert 'name="replaces"' not in content and "field-base_step" not in content
