"""The ASGI application of a site that uses chamvi_runs, in one call::

    # mysite/asgi.py
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

    from chamvi_runs.asgi import get_asgi_application

    application = get_asgi_application()

It serves Django's HTTP application and the chamvi websocket routes, and in embedded mode
(``CHAMVI_RUNS["EXECUTOR"] == "thread"``) it starts the in-process executor and janitor. A site with
a ``ProtocolTypeRouter`` of its own uses ``chamvi_runs.routing.websocket_application()`` and calls
``chamvi_runs.asgi.start_embedded()`` instead.
"""

from __future__ import annotations

from typing import Any

from .runtime.embedded import start_embedded


def get_asgi_application() -> Any:
    """Django's ``get_asgi_application()`` plus websockets, for daphne or ``runserver``.

    With ``DEBUG`` and ``django.contrib.staticfiles`` installed, HTTP requests for ``STATIC_URL`` are
    served from the finders (Django's ``ASGIStaticFilesHandler``, what ``runserver`` does), so the
    admin is styled under daphne too. Without ``DEBUG`` nothing here serves static files: a
    deployment runs ``collectstatic`` and lets its proxy or WhiteNoise serve ``STATIC_ROOT``.
    """
    from django.core.asgi import get_asgi_application as django_asgi_application

    # Settings and the app registry first: the websocket routes import models.
    http: Any = django_asgi_application()

    from channels.routing import ProtocolTypeRouter
    from django.apps import apps
    from django.conf import settings

    from .routing import websocket_application

    if settings.DEBUG and apps.is_installed("django.contrib.staticfiles"):
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

        http = ASGIStaticFilesHandler(http)
    start_embedded()
    return ProtocolTypeRouter({"http": http, "websocket": websocket_application()})


__all__ = ["get_asgi_application", "start_embedded"]
