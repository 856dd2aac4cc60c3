import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

from chamvi_runs.asgi import get_asgi_application

application = get_asgi_application()
