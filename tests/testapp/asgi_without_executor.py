"""A site's own ASGI application that forgets ``start_embedded()`` (system check W004)."""

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

from chamvi_runs.routing import websocket_application

application = ProtocolTypeRouter({"http": get_asgi_application(), "websocket": websocket_application()})
