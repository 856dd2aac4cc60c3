"""Steering inputs: what a user sends a run while it runs."""

from __future__ import annotations

from django.db import models

from .ids import new_input_id
from .runs import Run


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
