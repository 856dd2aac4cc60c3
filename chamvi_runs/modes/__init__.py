"""The deployment mode, chosen once from settings: ``Workers`` (``EXECUTOR = "rq"``: RQ workers
execute runs from ``QUEUE``, whose Redis the site's processes share) or ``Embedded``
(``"thread"``: this process executes, and keeps events in its memory). Every other module asks
``mode()`` and never reads ``EXECUTOR``: the doorbell rings through it and asks it (for the janitor) which
runs have a job waiting, the replay buffer which store to use, the websocket where its repairs are
counted. The system checks validate the setting (E003).

``mode()`` reads the settings on every call, so a test that overrides them gets the mode they
describe; embedded mode is built once per process, workers mode once per queue (with its Redis
client)."""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured

from ..conf import conf
from .base import EventLogs, Mode
from .embedded import Embedded
from .jobs import EXECUTE, EXECUTE_RUN, Job
from .threads import ThreadExecutor
from .workers import Workers

__all__ = [
    "EXECUTE",
    "EXECUTE_RUN",
    "Embedded",
    "EventLogs",
    "Job",
    "Mode",
    "ThreadExecutor",
    "Workers",
    "mode",
]

_embedded = Embedded()
_workers: dict[str, Workers] = {}
_lock = threading.Lock()


def mode() -> Mode:
    """This process's mode, as the settings say now."""
    executor = conf.EXECUTOR
    if executor == "thread":
        return _embedded
    if executor != "rq":
        raise ImproperlyConfigured(f"CHAMVI_RUNS['EXECUTOR'] must be 'rq' or 'thread', not {executor!r}")
    queue = conf.QUEUE
    with _lock:
        if queue not in _workers:
            _workers[queue] = Workers(queue)
        return _workers[queue]
