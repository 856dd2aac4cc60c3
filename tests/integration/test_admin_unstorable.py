"""Every admin of chamvi_runs, sent text PostgreSQL cannot store (a NUL, a lone surrogate) where a URL
or a form puts an id or a filter: an object id is a 404, a list's filter, search or any other
parameter lists nothing, a selected id selects nothing. Before, each was a 500 (psycopg refuses the
query). Against the real PostgreSQL, with rows present that an unfiltered list shows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.messages.storage.cookie import CookieStorage
from django.http import Http404, QueryDict
from django.test import Client, RequestFactory

from chamvi_runs import start_run, store
from chamvi_runs.models import Run, WaitPoint, WorkerVersion
from chamvi_runs.web.auth import create_token
from tests.support.helpers import execute, logged_in, make_superuser
from tests.support.scripted_server import Reply, finish, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

NUL, SURROGATE = "\x00", "\ud800"
ADMINS = {
    model._meta.model_name: model_admin
    for model, model_admin in admin.site._registry.items()
    if model._meta.app_label == "chamvi_runs"
}
# Parameters of every list that are no filter of its own: search, ordering, page, show all, facets.
LIST_PARAMETERS = ["q", "o", "p", "all", "_facets"]


@pytest.fixture
def rows(server) -> dict[str, Any]:
    """A row in every list: a waiting run (its steps, checkpoint and wait point), a run whose lease
    expired (a stuck run), an API token, a worker's version; and the superuser who looks."""
    server.script(
        "m-approving",
        [Reply(tool_call("c1", "refund", '{"order_id": "o", "amount_cents": 5}'), finish("tool_calls"))],
    )
    waiting = execute(start_run("approving", "x"))
    assert waiting.status == "waiting"
    stuck = start_run("basic", "x")
    assert store.claim(stuck.pk, "gone:1:2:3", 30)
    Run.objects.filter(pk=stuck.pk).update(claim_expires_at=stuck.created_at)
    root = make_superuser()
    create_token(root, "ci")
    WorkerVersion.objects.create(worker="host:1:2", agent="basic", version="v1")
    return {"root": root, "waiting": waiting, "stuck": stuck}


def _listed(response: Any) -> int:
    """How many rows the list shows."""
    assert response.status_code == 200, response.status_code
    return len(list(response.context["cl"].result_list))


def _parameters(model_admin: Any, root: Any) -> list[str]:
    """What a URL may filter this list by: each list filter's parameters (as the list itself reads
    them), and a lookup on each of the model's own fields, which the admin allows."""
    request = RequestFactory().get("/")
    request.user = root
    changelist = model_admin.get_changelist_instance(request)
    names = [p for spec in changelist.filter_specs for p in spec.expected_parameters()]
    fields = [f.name for f in model_admin.model._meta.concrete_fields]
    return sorted({*names, *fields, *LIST_PARAMETERS})


@pytest.mark.parametrize("name", sorted(ADMINS))
def test_a_nul_in_an_object_id_is_a_404(rows, name):
    client = logged_in(rows["root"])
    for view in ("change", "history", "delete"):
        response = client.get(f"/admin/chamvi_runs/{name}/%00/{view}/")
        assert response.status_code == 404, (name, view)


@pytest.mark.parametrize("name", sorted(ADMINS))
def test_a_nul_in_any_parameter_of_a_list_lists_nothing(rows, name):
    client = logged_in(rows["root"])
    base = f"/admin/chamvi_runs/{name}/"
    assert _listed(client.get(base)) >= 1, "the list has a row to leave out"
    for parameter in _parameters(ADMINS[name], rows["root"]):
        assert _listed(client.get(base, {parameter: NUL})) == 0, (name, parameter)


def _request(root: Any, query: dict[str, str] | None = None, post: dict[str, list[str]] | None = None) -> Any:
    """A request as the admin gets it, with values a URL cannot carry (a lone surrogate: a browser's
    %ED%A0%80 is decoded to U+FFFD): the admin's own code must hold whatever reaches it."""
    request = RequestFactory().post("/") if post is not None else RequestFactory().get("/")
    request.user = root
    request._messages = CookieStorage(request)
    if query:
        request.GET = QueryDict(mutable=True)
        for key, value in query.items():
            request.GET[key] = value
    if post is not None:
        request.POST = QueryDict(mutable=True)
        for key, values in post.items():
            request.POST.setlist(key, values)
    return request


@pytest.mark.parametrize("name", sorted(ADMINS))
def test_a_lone_surrogate_in_an_object_id_or_a_parameter_matches_nothing(rows, name):
    model_admin, root = ADMINS[name], rows["root"]
    for view in (model_admin.change_view, model_admin.history_view, model_admin.delete_view):
        with pytest.raises(Http404):
            view(_request(root), SURROGATE)
    for parameter in _parameters(model_admin, root):
        response = model_admin.changelist_view(_request(root, {parameter: SURROGATE}))
        changelist = response.context_data["cl"]
        assert isinstance(changelist, ChangeList) and list(changelist.result_list) == [], (name, parameter)


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("run", "cancel_runs"),
        ("run", "approve_open"),
        ("waitpoint", "approve"),
        ("stuckrun", "requeue_runs"),
        ("stuckrun", "move_to_current_version"),
        ("stuckrun", "cancel_runs"),
    ],
)
@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
def test_a_selected_id_with_unstorable_text_selects_nothing(rows, name, action, bad):
    before = list(Run.objects.order_by("pk").values()), list(WaitPoint.objects.order_by("pk").values())
    form = {"action": [action], "_selected_action": [bad], "index": ["0"]}
    if bad == NUL:  # through HTTP
        response = logged_in(rows["root"]).post(f"/admin/chamvi_runs/{name}/", form, follow=True)
        said = [str(m) for m in response.context["messages"]]
    else:  # what no URL or form can carry, to the view itself
        request = _request(rows["root"], post=form)
        request._dont_enforce_csrf_checks = True
        response = ADMINS[name].changelist_view(request)
        said = [str(m) for m in request._messages]
    assert response.status_code in (200, 302)
    assert any("Items must be selected" in m for m in said), said
    after = list(Run.objects.order_by("pk").values()), list(WaitPoint.objects.order_by("pk").values())
    assert after == before


def test_an_autocomplete_search_with_a_nul_finds_nothing(rows):
    client: Client = logged_in(rows["root"])
    query = {"app_label": "chamvi_runs", "model_name": "waitpoint", "field_name": "run"}
    found = client.get("/admin/autocomplete/", {**query, "term": rows["waiting"].pk[:8]})
    assert found.status_code == 200 and found.json()["results"], "the search finds the run"
    response = client.get("/admin/autocomplete/", {**query, "term": NUL})
    assert response.status_code == 200 and response.json()["results"] == []
