"""Attachments, the durable results of effect tools, and the HTTP API's tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .ids import new_artifact_id
from .runs import Run


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
