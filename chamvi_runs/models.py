"""Run, Step, Checkpoint, WaitPoint and their helpers. Fields, constraints and indexes only:
every write of run state goes through ``chamvi_runs.store``."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.urls import reverse

from .core.states import Status


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def new_run_id() -> str:
    return new_id("run")


def new_approval_id() -> str:
    return new_id("apr")


def new_artifact_id() -> str:
    return new_id("art")


def new_input_id() -> str:
    return new_id("inp")


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_run_id, editable=False)
    agent = models.CharField(max_length=200, db_index=True)
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
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The database's clock: runs of one key or thread start in creation order, whichever host created
    # them, and hosts' clocks disagree.
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

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
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="checkpoint")
    step_index = models.PositiveIntegerField()
    messages = models.JSONField(help_text="Full history after the step, without system instructions.")
    finish_reason = models.CharField(max_length=50, blank=True, default="")
    created_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.run_id} @ {self.step_index}"


class WaitPoint(models.Model):
    class Decision(models.TextChoices):
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"
        # The run was cancelled while it waited: nobody decided the call, and it never ran.
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waitpoints")
    kind = models.CharField(max_length=20, default="approval")
    approval_id = models.CharField(max_length=40, unique=True, default=new_approval_id, editable=False)
    step_index = models.PositiveIntegerField(help_text="The wait step that opened it.")
    # An approval belongs to one call: its model call's step and its position in that call's
    # tool_calls, bound to its exact arguments. The provider's call id is kept for the history only:
    # providers reuse ids across turns.
    model_step = models.PositiveIntegerField(default=0, help_text="The llm step whose call it decides.")
    call_position = models.PositiveIntegerField(default=0, help_text="The call's position in that step.")
    arguments_hash = models.CharField(max_length=64, blank=True, default="")
    tool_call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    input = models.JSONField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    token_hash = models.CharField(max_length=64, blank=True, default="")
    notified_at = models.DateTimeField(null=True, blank=True)
    notify_attempts = models.PositiveIntegerField(default=0)
    next_notify_at = models.DateTimeField(
        null=True, blank=True, help_text="No notifier call before this: one is in flight, or backing off."
    )
    decision = models.CharField(max_length=10, choices=Decision.choices, null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    # The raw token exists only in memory, for the notifier (SPEC §4).
    token: str | None = None

    class Meta:
        ordering = ["-created_at"]
        permissions = [("approve_waitpoint", "Can approve or deny a waiting run")]
        constraints = [
            models.UniqueConstraint(
                fields=["run"], condition=Q(decision__isnull=True), name="chamvi_waitpoint_one_open_per_run"
            ),
            models.UniqueConstraint(
                fields=["run", "model_step", "call_position"], name="chamvi_waitpoint_one_per_call"
            ),
            models.CheckConstraint(
                condition=Q(decision__isnull=True)
                | Q(decision__in=["approved", "denied", "expired", "cancelled"]),
                name="chamvi_waitpoint_decision_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} for {self.run_id} ({self.decision or 'open'})"


class RunInput(models.Model):
    """A steering input sent with ``send_input``; taken into account before the run's next model call."""

    id = models.CharField(primary_key=True, max_length=40, default=new_input_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="inputs")
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_step = models.PositiveIntegerField(null=True, blank=True)
    # Null for inputs an older release stored while the new one was rolled out (store.steering
    # measures those by their stored text).
    size = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Bytes of the payload as JSON, as MAX_PENDING_INPUT_BYTES counts them.",
    )

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"input {self.id} to {self.run_id}"


class Artifact(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_artifact_id, editable=False)
    file = models.FileField(upload_to="chamvi_artifacts/%Y/%m/")
    filename = models.CharField(max_length=255)
    media_type = models.CharField(max_length=255, default="application/octet-stream")
    size = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.filename} ({self.id})"


class EffectRecord(models.Model):
    """The durable result of one effect-tool execution; a repeat returns it instead of running again."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="effects")
    key = models.CharField(max_length=300)
    tool_name = models.CharField(max_length=200)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="chamvi_effect_once")]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.key}"


class ApiToken(models.Model):
    """A bearer token for the HTTP API, stored hashed; the raw token is shown once at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chamvi_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
