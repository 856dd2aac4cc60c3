"""A process that executes runs says which agent versions it has (SPEC §14), and that it is alive,
every ``HEARTBEAT_SECONDS``: the rows of ``store.versions``, which route jobs to workers of their
run's version and tell when a version is gone from every worker. One thread per process: an RQ
worker (``chamvi_runs.worker``) or a web process in embedded mode starts it."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from django.db import connection

from .. import store
from ..agents.agent import registry
from ..conf import conf
from ..dispatch.doorbell import enqueue, waiting_jobs

logger = logging.getLogger(__name__)


class Presence:
    def __init__(self) -> None:
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Say so now (before the process takes a job), then every heartbeat, in a thread; and ring
        for the ready runs of these versions, whose jobs a worker without them dropped while none
        was live (the first workers of a release). Idempotent."""
        with self._lock:
            if self._thread is not None:
                return
            self._stopping = threading.Event()
            self._beat(self._stopping)
            self._thread = threading.Thread(
                target=self._run, args=(self._stopping,), name="chamvi-presence", daemon=True
            )
            self._thread.start()
        self._ring_dropped()

    def stop(self) -> None:
        """The process stops cleanly: its versions are not live from now on."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stopping.set()
            thread.join(5)
        if thread.is_alive():
            # A beat stuck on the database could still write its rows live after the stop: they
            # are left to run out instead, a lease from the last beat.
            logger.warning("worker %s: its versions stay live until their lease runs out", self.name)
            return
        try:
            store.stop_worker(self.name)
        except Exception:
            logger.warning("could not record that worker %s stopped", self.name, exc_info=True)
        finally:
            connection.close()

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.wait(conf.HEARTBEAT_SECONDS):
            self._beat(stopping)

    def _beat(self, stopping: threading.Event) -> None:
        try:
            if not stopping.is_set():
                store.beat(self.name, registry.versions(), conf.LEASE_SECONDS)
        except Exception:
            # The database restarting: the next beat says it again, well within a lease.
            logger.warning("worker %s could not say which versions it has", self.name, exc_info=True)
        finally:
            # Two statements a heartbeat do not need a connection kept open between them.
            connection.close()

    def _ring_dropped(self) -> None:
        try:
            waiting = waiting_jobs()
            for run_id, agent, version in store.ready_runs_of(registry.versions()):
                if run_id not in waiting:
                    enqueue(run_id, (agent, version))
        except Exception:
            # chamvi_tick rings for them once they are quiet for a lease, as for any lost job.
            logger.warning("worker %s could not ring for the runs of its versions", self.name, exc_info=True)
        finally:
            connection.close()


presence = Presence()
"""This process's."""
