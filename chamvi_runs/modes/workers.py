"""Workers mode (``EXECUTOR = "rq"``): RQ workers execute runs, taking jobs from the queue. The
queue's Redis holds what the site's processes share: the jobs, the replay buffer and the counters
of stream repairs."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import EventLogs, L, Mode
from .jobs import EXECUTE_RUN

if TYPE_CHECKING:
    from redis import Redis

logger = logging.getLogger(__name__)

JOB_PREFIX = "chamvi-"


def job_id(run_id: str) -> str:
    """The run id in the job id lets the janitor see which runs already have a job waiting."""
    return f"{JOB_PREFIX}{secrets.token_hex(4)}-{run_id}"


def run_of(job: str) -> str | None:
    """The run of a job id ``job_id`` made (None: another application's job on the queue)."""
    return job.split("-", 2)[2] if job.startswith(JOB_PREFIX) else None


class Workers(Mode):
    def __init__(self, queue: str) -> None:
        import django_rq
        from rq.serializers import JSONSerializer

        self.queue = queue
        # One client (and connection pool) per queue and process, for the jobs, the buffer and the
        # counters: redis-py clients are thread-safe, and django_rq opens a new one per call.
        self.redis: Redis = django_rq.get_connection(queue)
        self.rq_queue = django_rq.get_queue(queue, serializer=JSONSerializer, connection=self.redis)

    def __str__(self) -> str:
        return f'queue "{self.queue}"'

    def ring(self, run_id: str, stamp: Callable[[], dict[str, str]]) -> None:
        self.rq_queue.enqueue(
            EXECUTE_RUN.path,
            run_id,
            job_id=job_id(run_id),
            # The site that rang: a worker of another site on the same queue puts the job back (sites.py).
            meta=stamp(),
            # One job is one execution, which may stream for long; the lease, not RQ, bounds it.
            job_timeout=-1,
            # The job hands its run to a thread and returns None: a result is nothing worth storing.
            result_ttl=0,
            failure_ttl=86400,
        )

    def waiting_jobs(self) -> set[str]:
        return {run for job in self.rq_queue.get_job_ids() if (run := run_of(job)) is not None}

    def event_log(self, logs: EventLogs[L]) -> L:
        return logs.in_redis(self.queue, self.redis)

    def count_drops(self, key: str, kind: str, count: int) -> None:
        try:
            self.redis.hincrby(key, kind, count)
        except Exception:  # the counter is for operators; failing to count must not end a stream
            logger.warning("could not count %d %s events in %s", count, kind, key, exc_info=True)
