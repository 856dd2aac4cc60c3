"""Which agent versions the processes that execute runs have (SPEC §14): one row per process and
agent, written by the process itself (``runtime.presence``) and read where a run's version must find
a worker (``store.versions``). A process that executes runs is an RQ worker, or a web process in
embedded mode."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class WorkerVersion(models.Model):
    worker = models.CharField(max_length=200, help_text="The process: host:pid:nonce.")
    agent = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    started_at = models.DateTimeField(db_default=Now())
    seen_at = models.DateTimeField(
        db_default=Now(), help_text="When the process last said it is alive (every HEARTBEAT_SECONDS)."
    )
    live_until = models.DateTimeField(
        db_default=Now(),
        help_text="It is live until then (LEASE_SECONDS after it last said so), unless it stopped.",
    )
    stopped_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the process stopped cleanly; empty while it runs or if it died.",
    )

    class Meta:
        verbose_name = "worker version"
        constraints = [models.UniqueConstraint(fields=["worker", "agent"], name="chamvi_worker_agent_unique")]
        indexes = [models.Index(fields=["agent", "version"], name="chamvi_workerversion_agent")]

    def __str__(self) -> str:
        return f"{self.worker}: {self.agent}@{self.version}"
