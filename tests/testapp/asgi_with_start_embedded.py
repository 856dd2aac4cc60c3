"""A site's own ASGI application that starts the embedded executor itself."""

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

from chamvi_runs.asgi import start_embedded
from chamvi_runs.routing import websocket_application

start_embedded()
application = ProtocolTypeRouter({"http": get_asgi_application(), "websocket": websocket_application()})
