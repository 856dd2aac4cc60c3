"""Which worker a job goes to during a deploy (SPEC §14): the doorbell stamps each job with its
run's agent and version, and a worker that does not have that version leaves the job to one that
does.

The claim is what guarantees it (a worker claims no run of a version it lacks, whatever the job
says); the stamp only spares the claim's round trip and, above all, the wait for ``chamvi_tick``:
a job a worker refused would be lost, and its run rung again only once it is quiet for a lease. So
a worker that takes a job of a version it lacks puts it back on the queue when some live worker has
that version, and drops it when none has: the run waits, listed by the admin's stuck runs, until a
worker of its version comes back or its agent's rule moves it on (``runtime.version_moves``).
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from typing import Any

from django.db import Error

from .. import store
from ..models import Run
from ..modes import EXECUTE_RUN

logger = logging.getLogger(__name__)

AGENT = "chamvi_agent"
"""The job meta key of the run's agent."""
VERSION = "chamvi_version"
"""The job meta key of the run's agent version."""


def stamp(run_id: str, version: tuple[str, str] | None) -> dict[str, str]:
    """The job meta of a run's version: ``version`` (agent, version) when the caller knows it,
    else read. Nothing for a run recorded without a version, or when the database cannot say now
    (the claim decides)."""
    if version is None:
        try:
            version = Run.objects.filter(pk=run_id).values_list("agent", "agent_version").first()
        except Error:
            return {}
    if version is None or not version[1]:
        return {}
    return {AGENT: version[0], VERSION: version[1]}


class Route(Enum):
    TAKE = "take"
    """This worker has the job's version, or the job has none."""
    PUT_BACK = "put back"
    """Another live worker has it."""
    DROP = "drop"
    """No live worker has it: the run waits for one, or for its agent's rule."""


class Router:
    """A worker's routing of jobs by version. That a version is live is asked of the database at
    most once every ``LIVE_FOR`` seconds: during a deploy a worker may pass over thousands of the
    other release's jobs in a row. That it is not is asked every time: a job is dropped only on
    what the database says now (its workers may have just started)."""

    LIVE_FOR = 2.0

    def __init__(self) -> None:
        self._live: dict[tuple[str, str], tuple[bool, float]] = {}

    def route(self, job: Any, versions: dict[str, str]) -> Route:
        """Where ``job`` goes from a worker whose agents have ``versions``. The caller closes the
        connection it may have opened (the worker's main thread keeps none between jobs)."""
        if getattr(job, "func_name", None) != EXECUTE_RUN.path:
            return Route.TAKE
        meta = job.meta or {}
        agent, version = meta.get(AGENT), meta.get(VERSION)
        if not isinstance(agent, str) or not isinstance(version, str) or versions.get(agent) == version:
            return Route.TAKE
        try:
            live = self._is_live(agent, version)
        except Error:
            return Route.TAKE  # the claim finds out what it can do, as ever
        return Route.PUT_BACK if live else Route.DROP

    def _is_live(self, agent: str, version: str) -> bool:
        now = time.monotonic()
        known = self._live.get((agent, version))
        if known is not None and known[1] > now:
            return known[0]
        live = store.is_live(agent, version)
        if live:
            self._live[(agent, version)] = (live, now + self.LIVE_FOR)
        return live


def report_drop(job: Any, versions: dict[str, str]) -> None:
    """Log why ``job`` left the queue. Louder when this worker has the run's agent at another
    version and no worker ever had the run's: a new release's web processes started before its
    workers, or the process that started it defines the agent otherwise (a model name read from its
    own environment), whose runs would wait until an operator moves them."""
    meta = job.meta or {}
    run_id = job.args[0] if job.args else "?"
    agent, version = meta.get(AGENT), meta.get(VERSION)
    try:
        unknown = agent in versions and not store.was_seen(str(agent), str(version))
    except Error:
        unknown = False
    if unknown:
        logger.warning(
            "run %s is of agent %r version %r, which no worker has ever had (this one has %r): "
            "either the workers of the release that started it have not started yet, or the process "
            "that started it defines the agent otherwise (its model, instructions or tools from "
            "other settings or environment?). It waits, listed by the admin's stuck runs, until a "
            "worker has that version or it is moved to the current one",
            run_id,
            agent,
            version,
            versions[str(agent)],
        )
        return
    logger.info(
        "run %s is of agent %r version %r, which no live worker has: it waits for one, or for its "
        "agent's on_version_change rule (chamvi_tick, after VERSION_GRACE_SECONDS)",
        run_id,
        agent,
        version,
    )
