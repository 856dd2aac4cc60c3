"""Embedded mode (``modes.Embedded``): one process serves, executes and recovers. Starts the
executor threads and a janitor thread, once, when the ASGI application asks for them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from ..modes import Embedded, mode

logger = logging.getLogger(__name__)


class _Embedded:
    """Whether this process asked to execute runs in embedded mode, and whether its threads run.

    System check W004 imports the site's ASGI application to see whether it asks; while it does
    (``inspecting``), ``start_embedded()`` records the request and starts nothing: ``manage.py
    migrate`` must execute no run. The check then forgets the module, so the server that imports
    it next (``runserver``, in the same process) runs ``start_embedded()`` for real.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requested = False
        self.started = False
        self.inspecting = False


_embedded = _Embedded()


@contextmanager
def inspecting() -> Iterator[None]:
    """While the block runs, ``start_embedded()`` records the request and starts nothing."""
    with _embedded.lock:
        _embedded.inspecting = True
    try:
        yield
    finally:
        with _embedded.lock:
            _embedded.inspecting = False


def embedded_requested() -> bool:
    return _embedded.requested


def start_embedded(interval: float = 2.0) -> None:
    """Start the executor threads and a janitor thread in this process. Idempotent; no-op in workers mode.
    ``chamvi_runs.asgi.get_asgi_application()`` calls it for you."""
    site = mode()
    if not isinstance(site, Embedded):
        return
    with _embedded.lock:
        _embedded.requested = True
        if _embedded.started or _embedded.inspecting:
            return
        site.executor()
        _embedded.started = True
    from .presence import presence  # imports the models, as the janitor does

    # This process executes runs: which agent versions it has (SPEC §14), like a worker's.
    presence.start()
    threading.Thread(target=_janitor_loop, args=(interval,), name="chamvi-janitor", daemon=True).start()


def _janitor_loop(interval: float) -> None:
    from .janitor import tick_once  # imports the models: the app registry is ready by now

    while True:
        try:
            tick_once()
        except Exception:
            logger.exception("embedded janitor tick failed")
        finally:
            connection.close()
        time.sleep(interval)
