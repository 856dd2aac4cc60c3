"""A worker told to stop (a deploy's SIGTERM) leaves RQ's command channel at once, whatever order
its listening thread and the stop meet in."""

from __future__ import annotations

import pytest
from django.db import connections

from chamvi_runs.worker import Worker
from tests.support.processes import wait_for


@pytest.mark.timeout(20)
def test_a_stopping_worker_is_not_held_by_its_command_listener(redis, monkeypatch):
    # The worker makes this process's connections persistent; the test puts them back as they were.
    for connection in connections.all():
        settings = connection.settings_dict
        monkeypatch.setitem(settings, "CONN_MAX_AGE", settings["CONN_MAX_AGE"])
    worker = Worker(["chamvi"], connection=redis)
    worker.subscribe()
    try:
        # The order the fault suite's SIGTERM drain met now and then: the listening thread reads the
        # unsubscribe's reply before the worker stops it. It used to wait 60 s (RQ's read) for a new
        # subscription, and redis-py 8.2's stop() waited for it: the test's timeout stops that.
        worker.pubsub.unsubscribe()
        wait_for(lambda: not worker.pubsub.subscribed, 5, "the listener to read the unsubscribe")
        worker.unsubscribe()
        assert not worker.pubsub_thread.is_alive()
    finally:
        worker.pubsub.close()
