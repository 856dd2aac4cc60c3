"""Websocket routes: ``ws/chamvi/runs/<run_id>/`` and ``ws/chamvi/threads/<thread>/``."""

from __future__ import annotations

from typing import Any

from django.urls import re_path


def websocket_urlpatterns() -> list[Any]:
    from .web.consumers import RunConsumer
    from .web.thread_consumer import ThreadConsumer

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


def guarded(routes: Any) -> Any:
    """``routes`` (a ``URLRouter`` of websocket routes) behind chamvi's handshake
    (``web/socket_auth.py``): an API token offered as a subprotocol, else the session cookie with an
    Origin that Django's CSRF check would take. A site that adds routes of its own serves
    ``guarded(URLRouter([*websocket_urlpatterns(), ...]))``."""
    from .web.socket_auth import SocketGuard

    return InMemoryLayerLoop(SocketGuard(routes))


def websocket_application() -> Any:
    """The websocket side for ``ProtocolTypeRouter``: the chamvi routes, ``guarded``."""
    from channels.routing import URLRouter

    return guarded(URLRouter(websocket_urlpatterns()))
