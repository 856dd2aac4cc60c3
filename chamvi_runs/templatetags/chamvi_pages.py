"""Filters of the bundled pages: ``{% load chamvi_pages %}`` in an overriding template."""

from __future__ import annotations

from typing import Any

from django import template

from ..models import Run
from ..streaming.serializers import pretty_json

register = template.Library()


@register.filter(name="pretty_json")
def pretty_json_filter(value: Any) -> str:
    """Indented JSON, as the pages' script renders it; the template escapes it like any text."""
    return pretty_json(value)


@register.filter
def as_text(value: Any) -> str:
    """A steering message or trigger message: a string as it is, anything else as indented JSON."""
    return value if isinstance(value, str) else pretty_json(value)


@register.simple_tag
def recent_runs(user: Any, limit: int = 10) -> list[Run]:
    """The latest runs ``user`` started, newest first: ``{% recent_runs user as runs %}``."""
    if not getattr(user, "is_authenticated", False):
        return []
    return list(Run.objects.filter(created_by=user).order_by("-created_at")[:limit])
