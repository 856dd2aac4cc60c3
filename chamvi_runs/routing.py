"""Websocket routes: ``ws/chamvi/runs/<run_id>/`` and ``ws/chamvi/threads/<thread>/``."""

from __future__ import annotations

from typing import Any

from django.urls import re_path


def websocket_urlpatterns() -> list[Any]:
    from .consumers import RunConsumer, ThreadConsumer

    return [
        re_path(r"^ws/chamvi/runs/(?P<run_id>[\w-]+)/$", RunConsumer.as_asgi()),
        re_path(r"^ws/chamvi/threads/(?P<thread>[^/]+)/$", ThreadConsumer.as_asgi()),
    ]


def websocket_application() -> Any:
    """The websocket side for ``ProtocolTypeRouter``: sessions, and Origin checked against ALLOWED_HOSTS."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter
    from channels.security.websocket import AllowedHostsOriginValidator

    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns())))
