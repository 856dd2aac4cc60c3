"""Shared test helpers."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.admin.utils import quote
from django.db.models import Model
from django.urls import reverse

from chamvi_runs import engine
from chamvi_runs.broadcast import event_log
from chamvi_runs.models import Run


def execute(run: Run | str) -> Run:
    """Execute the run in this process (as a worker would) and return it fresh."""
    run_id = run if isinstance(run, str) else run.pk
    engine.execute(run_id)
    return Run.objects.get(pk=run_id)


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
