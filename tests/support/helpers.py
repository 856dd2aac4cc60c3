"""Shared test helpers."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from unittest import mock

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import close_old_connections, connection
from django.db.models import F, Model
from django.test import Client
from django.urls import reverse
from django.utils.crypto import get_random_string

from chamvi_runs.models import Run
from chamvi_runs.runtime import engine
from chamvi_runs.streaming.broadcast import ChannelsBroadcaster, event_log


def execute(run: Run | str) -> Run:
    """Execute the run in this process (as a worker would) and return it fresh."""
    run_id = run if isinstance(run, str) else run.pk
    engine.execute(run_id)
    return Run.objects.get(pk=run_id)


def execute_losing_run_end(run: Run | str) -> Run:
    """``execute``, as if the process died (or Redis refused the batch) between the settle's commit
    and the buffer's append of run.end: every other event is buffered and sent, run.end is not."""
    publish = ChannelsBroadcaster.publish

    def all_but_run_end(self: ChannelsBroadcaster, run_id: str, event: dict[str, Any]) -> None:
        if event.get("type") != "run.end":
            publish(self, run_id, event)

    with mock.patch.object(ChannelsBroadcaster, "publish", all_but_run_end):
        return execute(run)


def _execute_closing(run_id: str, lose_run_end: bool = False) -> Run:
    try:
        return (execute_losing_run_end if lose_run_end else execute)(run_id)
    finally:
        close_old_connections()
        connection.close()


# ``execute`` (or ``execute_losing_run_end``) in a thread of its own, from async test code: the thread
# closes its database connection, which the test's teardown would otherwise find open.
execute_in_thread = sync_to_async(_execute_closing, thread_sensitive=False)


def events(run: Run | str) -> list[dict[str, Any]]:
    return event_log().after(run if isinstance(run, str) else run.pk, 0)


def first_user_block(request: dict[str, Any]) -> dict[str, Any]:
    """The JSON block of the first user message the model received."""
    user = next(m for m in request["messages"] if m["role"] == "user")
    content = user["content"]
    text = content[0]["text"] if isinstance(content, list) else content
    return json.loads(text)


def admin_url(obj: Model, view: str = "change") -> str:
    """The admin's own URL of an object: ids hold "_", which the admin's URLs escape (an id with
    "_3A" in it written raw reads as ":" and 302s to the index)."""
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[quote(obj.pk)])


def expire_lease(run_id: str, attempt: int | None = None) -> None:
    """Move the run's lease an hour into the past (only while at ``attempt``, if given): a held run
    is then claimable, as if its worker had died, without waiting the lease out."""
    runs = Run.objects.filter(pk=run_id)
    if attempt is not None:
        runs = runs.filter(attempt=attempt)
    runs.update(claim_expires_at=F("claim_expires_at") - timedelta(hours=1))


# --- users and their clients --------------------------------------------------------------------

PASSWORD = "pw"


def make_user(name: str, *perms: str, **fields: Any) -> Any:
    """User ``name`` (password ``PASSWORD``, email <name>@example.com) with the permissions ``perms``:
    "app_label.codename", or a codename of chamvi_runs."""
    model = get_user_model()
    user = model.objects.create_user(name, f"{name}@example.com", PASSWORD, **fields)
    for perm in perms:
        app_label, _, codename = perm.rpartition(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label or "chamvi_runs", codename=codename)
        )
    return model.objects.get(pk=user.pk)  # fresh: permissions are cached per instance


def make_superuser(name: str = "root") -> Any:
    return get_user_model().objects.create_superuser(name, f"{name}@example.com", PASSWORD)


def logged_in(user: Any, **client_options: Any) -> Client:
    """A test client with ``user``'s session; ``client.user`` is that user."""
    client = Client(**client_options)
    client.force_login(user)
    client.user = user  # type: ignore[attr-defined]
    return client


def session_cookie(user: Any) -> str:
    """The Cookie header of a session of ``user``, for sockets that are not Django test clients."""
    return f"sessionid={logged_in(user).cookies['sessionid'].value}"


class Api:
    """A test client speaking JSON; a session client sends the CSRF cookie and header unless told not to."""

    def __init__(self, client: Client, headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.headers = headers or {}

    def get(self, url: str, **kwargs: Any):
        return self.client.get(url, headers=self.headers, **kwargs)

    def post(self, url: str, data: Any = None, *, raw: str | bytes | None = None, csrf: bool = True):
        body = raw if raw is not None else ("" if data is None else json.dumps(data))
        headers = self.headers if csrf else {k: v for k, v in self.headers.items() if k != "X-CSRFToken"}
        return self.client.post(url, body, content_type="application/json", headers=headers)


def session_api(user: Any) -> Api:
    """A logged-in browser: session cookie, csrftoken cookie, X-CSRFToken header (CSRF enforced)."""
    client = logged_in(user, enforce_csrf_checks=True)
    secret = get_random_string(32)
    client.cookies[settings.CSRF_COOKIE_NAME] = secret
    return Api(client, {"X-CSRFToken": secret})


def bearer_api(raw: str) -> Api:
    """A client authenticated by the API token ``raw``; CSRF is enforced, which token requests skip."""
    return Api(Client(enforce_csrf_checks=True), bearer(raw))


def bearer(raw: str) -> dict[str, str]:
    """The headers that authenticate a request with the API token ``raw``."""
    return {"Authorization": f"Bearer {raw}"}


def anonymous_api() -> Api:
    return Api(Client(enforce_csrf_checks=True))
