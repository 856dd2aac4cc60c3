import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from chamvi_runs.executors import start_embedded  # noqa: E402
from chamvi_runs.routing import websocket_application  # noqa: E402

start_embedded()

application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket_application()})
