"""The id factories: an unguessable id with a prefix that says what it names. The migrations name
them as ``chamvi_runs.models.new_run_id`` and so on (the package re-exports them)."""

from __future__ import annotations

import secrets


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
