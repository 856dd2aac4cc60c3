"""A run, the thread it continues, and its history: the steps it saved and its checkpoint."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.urls import reverse

from ..core.messages import history_before
from ..core.states import Status
from .ids import new_run_id


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_run_id, editable=False)
    agent = models.CharField(max_length=200, db_index=True)
    # A database default: the previous release, still running during a deploy, inserts runs
    # without it (an empty version: the run was started before versions were recorded).
    agent_version = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text="The version of its agent the run started with (SPEC §14).",
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="Where the run came from, for every execution to carry on (the W3C trace context "
        "of the caller that started it, with OpenTelemetry: chamvi_runs.tracing).",
    )
    listed_tools = models.JSONField(
        null=True,
        blank=True,
        help_text="The listing of each toolset (an MCP server's tools) the run saw first, by the "
        "toolset's name: every later execution of the run has the same tools.",
    )
    status = models.CharField(
        max_length=20, choices=[(s.value, s.name.title()) for s in Status], default=Status.QUEUED.value
    )
    trigger = models.JSONField(help_text="The trigger envelope: id, source, trigger, payload, keys, thread.")
    trigger_id = models.CharField(
        max_length=200,
        null=True,
        blank=True,
        help_text="Envelope id: starting an agent twice with it is a no-op.",
    )
    scope = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Namespace of trigger_id and concurrency_key: empty is global (Python callers); "
        "HTTP callers get the policy's scope for them, so users never share a key or trigger id.",
    )
    concurrency_key = models.CharField(max_length=200, null=True, blank=True)
    thread = models.CharField(max_length=200, null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=50, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0, help_text="Model calls across all executions.")
    claim_owner = models.CharField(max_length=200, null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0, help_text="Fencing token: grows with every claim.")
    stalled_executions = models.PositiveIntegerField(
        default=0,
        help_text="Executions in a row that ended without saving anything (their worker died); "
        "MAX_ATTEMPTS of them fail the run with too_many_attempts.",
    )
    cancel_requested = models.BooleanField(default=False)
    # Where the history of a fork, a regenerate or a resend starts (SPEC §12): after step
    # ``base_step`` of run ``base`` (-1: the history ``base`` itself started from). Null for every
    # other run: a thread's next run goes on from the thread's latest history.
    # No constraint, and left as it is when that run is deleted: a fork whose history is gone fails
    # (``history_unavailable``) rather than start as a plain run.
    base = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    base_step = models.IntegerField(null=True, blank=True)
    replaces = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="replaced_by",
        db_constraint=False,
        help_text="The run this one regenerates or resends: the thread continues from this one.",
    )
    # A child run (SPEC §13): started by one tool call of its parent, the call at ``parent_position``
    # of the model call saved as step ``parent_step``. At most one child per call (a constraint).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    parent_step = models.PositiveIntegerField(null=True, blank=True)
    parent_position = models.PositiveIntegerField(null=True, blank=True)
    depth = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="Delegations above this run: 0 for a run nobody delegated."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The database's clock: runs of one key or thread start in creation order, whichever host created
    # them, and hosts' clocks disagree.
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # In memory only: the ids of the steering inputs the run took, when the write that settled it
    # returned them (``store.save_and_settle``), so its ``run.end`` reads nothing after the commit.
    receipt: list[str] | None = None

    class Meta:
        ordering = ["-created_at"]
        permissions = [("cancel_run", "Can cancel a run")]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in Status]), name="chamvi_run_status_valid"
            ),
            models.UniqueConstraint(
                fields=["agent", "scope", "trigger_id"],
                condition=Q(trigger_id__isnull=False),
                name="chamvi_run_unique_trigger_id",
            ),
            models.CheckConstraint(
                condition=Q(claim_owner__isnull=True) | Q(claim_expires_at__isnull=False),
                name="chamvi_run_claim_has_expiry",
            ),
            models.UniqueConstraint(
                fields=["parent", "parent_step", "parent_position"],
                condition=Q(parent__isnull=False),
                name="chamvi_run_one_child_per_call",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "claim_expires_at"], name="chamvi_run_claimable"),
            models.Index(
                fields=["scope", "concurrency_key", "status", "created_at"], name="chamvi_run_concurrency"
            ),
            models.Index(fields=["thread", "status", "created_at"], name="chamvi_run_thread"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.id} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("chamvi_runs:run", args=[self.pk])

    @property
    def error(self) -> dict[str, str] | None:
        return {"code": self.error_code, "message": self.error_message} if self.error_code else None


class StuckRun(Run):
    """The admin's "Stuck runs": the same rows as Run, as ``store.queries.stuck_runs`` selects them,
    with their own view permission and the permission to requeue them."""

    # Set by store.queries.stuck_runs on the rows it returns.
    stuck_reason: str
    stuck_for: timedelta
    stuck_child: str | None
    """A waiting run stuck on its child run: that child."""

    class Meta:
        proxy = True
        verbose_name = "stuck run"
        permissions = [("requeue_run", "Can requeue a stuck run")]


class Thread(models.Model):
    """A conversation that runs continue. It belongs to the user who started its first run (no user
    for runs started without ``created_by``); runs of other users may not join it (SPEC §3).

    A thread is named within a ``scope``, as concurrency keys and trigger ids are: the runs of a
    thread are those with its ``scope`` and ``name`` (``Run.scope``, ``Run.thread``). Over HTTP the
    scope is the policy's for the caller, so one user cannot take a name another will use; from
    Python it is empty (one global namespace) unless the site passes one."""

    scope = models.CharField(max_length=200, blank=True, default="", db_default="")
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "name"], name="chamvi_thread_scope_name")]

    def __str__(self) -> str:
        return self.name


class Step(models.Model):
    class Kind(models.TextChoices):
        LLM = "llm"
        TOOL = "tool"
        WAIT = "wait"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=200, blank=True, default="")
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    messages = models.JSONField(
        null=True,
        blank=True,
        help_text="The messages this step added to the run's history, or their count when the whole "
        "history was written with it (the checkpoint holds them); null: written by a release that "
        "stored histories whole.",
    )
    attempt = models.PositiveIntegerField(default=0, help_text="The claim attempt that wrote this step.")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="chamvi_step_unique_index"),
            models.CheckConstraint(
                condition=Q(kind__in=["llm", "tool", "wait"]), name="chamvi_step_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.index} {self.kind} {self.name}"


class Checkpoint(models.Model):
    """Where a run's history stands: after step ``step_index``. ``history()`` is the whole of it,
    and ``history(index)`` the history after any earlier step (SPEC §4, §12).

    A step writes what it added (``Step.messages``); ``messages`` holds the whole history as of step
    ``whole_step``. It is written whole while the history is short, by each execution's first save
    and whenever the run leaves its worker (it waits or settles): ``messages`` is the whole history
    whenever no execution is under way, which is all a process of the previous release reads. Once a
    history is long, a step of a running execution does not write it again (its cost would grow with
    the history): ``history()`` adds the steps saved since."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="checkpoint")
    step_index = models.PositiveIntegerField()
    messages = models.JSONField(
        help_text="The whole history after step whole_step (after step_index, when whole_step is null)."
    )
    whole_step = models.IntegerField(
        null=True, blank=True, help_text="The step after which ``messages`` is the whole history."
    )
    whole_length = models.PositiveIntegerField(
        null=True, blank=True, help_text="Messages in ``messages`` when it was written at whole_step."
    )
    length = models.PositiveIntegerField(null=True, blank=True, help_text="Messages in the whole history.")
    opening_length = models.PositiveIntegerField(
        null=True, blank=True, help_text="Messages before the run's first step (null: not known)."
    )
    finish_reason = models.CharField(max_length=50, blank=True, default="")
    created_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.run_id} @ {self.step_index}"

    def history(self, index: int | None = None) -> list[Any]:
        """The whole history after step ``index`` (``step_index`` by default; -1: before the run's
        first step), read from ``messages`` and the steps saved since. Raises ValueError when it
        cannot be rebuilt: a step the run does not have yet, or one before a history a release that
        stored histories whole wrote."""
        at = self.step_index if index is None else index
        if at > self.step_index:
            raise ValueError(f"run {self.run_id} has no step {at} in its history")
        full = list(self.messages)
        if self._behind():
            parts = self._parts(self.whole_step, self.step_index)
            full += [message for part in parts for message in part or ()]
        if at == self.step_index:
            return full
        steps = Step.objects.filter(run_id=self.run_id, index__lte=at)
        parts = list(steps.values_list("messages", flat=True))
        return history_before(self.run_id, full, self.opening_length, parts, at)

    def _behind(self) -> bool:
        """Whether steps saved after ``whole_step`` add to ``messages``: this release wrote it at
        that step (a release that writes it whole leaves ``whole_step`` behind, and ``messages`` at
        another length)."""
        return (
            self.whole_step is not None
            and self.whole_step < self.step_index
            and self.whole_length == len(self.messages)
        )

    def _parts(self, after: int | None, upto: int) -> list[Any]:
        steps = Step.objects.filter(run_id=self.run_id, index__gt=after, index__lte=upto).order_by("index")
        return list(steps.values_list("messages", flat=True))
