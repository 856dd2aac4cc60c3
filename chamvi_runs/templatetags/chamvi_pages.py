"""Filters of the bundled pages: ``{% load chamvi_pages %}`` in an overriding template."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import Resolver404, get_script_prefix, resolve

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


@register.simple_tag
def site_home() -> str:
    """The site's home page ("/" under the script prefix) when the site serves one there, else "":
    a fresh site's "/" is a 404, and the pages' "Site" link is left out. ``{% site_home as home %}``;
    base.html's ``site_link`` block draws it (override the block to link elsewhere)."""
    try:
        resolve("/")
    except Resolver404:
        return ""
    return get_script_prefix()
