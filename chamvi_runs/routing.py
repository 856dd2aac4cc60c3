"""Websocket routes: ``ws/chamvi/runs/<run_id>/`` and ``ws/chamvi/threads/<thread>/``."""

from __future__ import annotations

from typing import Any

from django.urls import re_path


def websocket_urlpatterns() -> list[Any]:
    from .web.consumers import RunConsumer, ThreadConsumer

    # django-stubs types a route's target as an HTTP view; channels' URLRouter routes ASGI
    # applications through the same re_path (channels' docs), so the targets are ignored here.
    return [
        re_path(r"^ws/chamvi/runs/(?P<run_id>[\w-]+)/$", RunConsumer.as_asgi()),  # type: ignore[arg-type]
        # A thread is any name, slashes included (the path arrives percent-decoded).
        re_path(r"^ws/chamvi/threads/(?P<thread>.+)/$", ThreadConsumer.as_asgi()),  # type: ignore[arg-type]
    ]


class InMemoryLayerLoop:
    """With the in-memory channel layer (embedded mode), events published from executor threads
    must be sent on the server's loop: that layer's queues wake only the loop they belong to."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        from .streaming.broadcast import publisher
        if isinstance(get_channel_layer(), InMemoryChannelLayer):
            publisher.use_loop()
        return await self.app(scope, receive, send)


def websocket_application() -> Any:
    """The websocket side for ``ProtocolTypeRouter``: sessions, and Origin checked against ALLOWED_HOSTS."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter
    from channels.security.websocket import AllowedHostsOriginValidator

    return InMemoryLayerLoop(
        AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns())))
    )
