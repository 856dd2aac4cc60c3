"""Where a run waits for a person or the page: an approval of a tool call, or a question's answer."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .ids import new_approval_id
from .runs import Run


class WaitPoint(models.Model):
    class Decision(models.TextChoices):
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"
        # The run was cancelled while it waited: nobody decided the call, and it never ran.
        CANCELLED = "cancelled"
        # A question's answer was recorded (``answer``): it becomes the tool's result. For a child
        # run's wait: the child completed, and its output is the answer.
        ANSWERED = "answered"
        # A child run ended without an output (failed or cancelled): ``reason`` is the tool's error.
        FAILED = "failed"

    class Kind(models.TextChoices):
        APPROVAL = "approval"
        # A question to the run's user (``human_tool``): answered, not approved.
        INPUT = "input"
        # A child run the call started (SPEC §13): decided when the child settles.
        CHILD = "child"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waitpoints")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.APPROVAL)
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
    input = models.JSONField(null=True, blank=True, help_text="The arguments the model proposed.")
    approved_input = models.JSONField(
        null=True,
        blank=True,
        help_text="The arguments a person approved instead of the proposal (null: approved as proposed); "
        "arguments_hash binds them.",
    )
    editable = models.BooleanField(
        default=True, db_default=True, help_text="Whether the approver may change the arguments."
    )
    answer_schema = models.JSONField(
        null=True, blank=True, help_text="A question's JSON Schema of the answer (null: any JSON)."
    )
    # Database defaults: the previous release, still running during a deploy, inserts wait points
    # without these columns.
    client = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A question the page's code answers (a client tool), not a person.",
    )
    answer = models.JSONField(null=True, blank=True, help_text="A question's answer, once answered.")
    child = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The child run a wait of kind child waits for.",
    )
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
    # Set by ``store.decide``: this decision was the run's last open one, and the run is running again.
    resumes: bool = False

    class Meta:
        ordering = ["-created_at"]
        permissions = [("approve_waitpoint", "Can approve or deny a waiting run")]
        constraints = [
            # Questions of one model call wait together; approvals one at a time.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(decision__isnull=True, kind="approval"),
                name="chamvi_waitpoint_one_open_approval",
            ),
            models.UniqueConstraint(
                fields=["run", "model_step", "call_position"], name="chamvi_waitpoint_one_per_call"
            ),
            models.CheckConstraint(
                condition=Q(decision__isnull=True)
                | Q(decision__in=["approved", "denied", "expired", "cancelled", "answered", "failed"]),
                name="chamvi_waitpoint_decision_valid",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["approval", "input", "child"]), name="chamvi_waitpoint_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} for {self.run_id} ({self.decision or 'open'})"
