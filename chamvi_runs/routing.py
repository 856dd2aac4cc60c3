"""Websocket routes: ``ws/chamvi/runs/<run_id>/`` and ``ws/chamvi/threads/<thread>/``."""

from __future__ import annotations

from typing import Any

from django.urls import re_path


def websocket_urlpatterns() -> list[Any]:
    from .consumers import RunConsumer, ThreadConsumer

    return [
        re_path(r"^ws/chamvi/runs/(?P<run_id>[\w-]+)/$", RunConsumer.as_asgi()),
        # A thread is any name, slashes included (the path arrives percent-decoded).
        re_path(r"^ws/chamvi/threads/(?P<thread>.+)/$", ThreadConsumer.as_asgi()),
    ]


class InMemoryLayerLoop:
    """With the in-memory channel layer (embedded mode), events published from executor threads
    must be sent on the server's loop: that layer's queues wake only the loop they belong to."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        from .broadcast import publisher
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
