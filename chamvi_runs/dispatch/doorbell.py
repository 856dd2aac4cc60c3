"""The doorbell: after a commit, tell whoever executes runs that one is ready. RQ workers
(``EXECUTOR = "rq"``) get a job by dotted path; the embedded executor (``"thread"``) gets the id.
Either way the message carries only the run id: the database is the truth, a lost or duplicate
doorbell is harmless (the janitor re-rings; a claim refuses a taken run)."""

from __future__ import annotations

import secrets
import threading
from typing import Any

from django.db import transaction

from ..conf import conf
from ..core.faults import crash_point
from ..models import Run
from ..store import queries
from .sites import stamp
from .threads import JOB, thread_executor


def enqueue(run_id: str) -> None:
    """Ring the doorbell for ``run_id`` once the current transaction (if any) commits."""
    transaction.on_commit(lambda: _enqueue_now(run_id), robust=True)


def _enqueue_now(run_id: str) -> None:
    crash_point("before_enqueue")
    if conf.EXECUTOR == "thread":
        thread_executor().submit(run_id)
        return
    rq_queue(conf.QUEUE).enqueue(
        JOB,
        run_id,
        # The run id in the job id lets the janitor see which runs already have a job waiting.
        job_id=f"chamvi-{secrets.token_hex(4)}-{run_id}",
        # The site that rang: a worker of another site on the same queue puts the job back (sites.py).
        meta=stamp(),
        # One job is one execution, which may stream for long; the lease, not RQ, bounds it.
        job_timeout=-1,
        # The job hands its run to a thread and returns None: a result is nothing worth storing.
        result_ttl=0,
        failure_ttl=86400,
    )


_queues: dict[str, Any] = {}
_queues_lock = threading.Lock()


def rq_queue(name: str) -> Any:
    """The RQ queue, built once per process: django_rq.get_queue opens a new Redis client per call."""
    import django_rq
    from rq.serializers import JSONSerializer

    with _queues_lock:
        if name not in _queues:
            _queues[name] = django_rq.get_queue(name, serializer=JSONSerializer)
        return _queues[name]


def waiting_jobs() -> set[str]:
    """Ids of runs that have a job waiting in the queue, so the janitor rings no doorbell twice."""
    if conf.EXECUTOR == "thread":
        return thread_executor().pending()
    return {
        job_id.split("-", 2)[2]
        for job_id in rq_queue(conf.QUEUE).get_job_ids()
        if job_id.startswith("chamvi-")
    }


def enqueue_next_in_line(run: Run) -> None:
    """After ``run`` settles: the oldest queued run of its concurrency key or thread may start."""
    for run_id in queries.next_in_line(run):
        enqueue(run_id)
