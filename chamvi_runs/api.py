"""The Python API: start, steer, cancel and decide runs from any process."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import store
from .agents.agent import registry
from .conf import conf
from .core.storable import WHAT, unstorable
from .dispatch.doorbell import enqueue
from .errors import InvalidPayload, ThreadForbidden
from .models import Artifact, Run, RunInput, WaitPoint
from .policy import policy
from .runtime.lifecycle import announce_settled


def check_payload(payload: Any, what: str = "payload") -> int:
    """Raise InvalidPayload unless ``payload`` is JSON data within ``MAX_PAYLOAD_BYTES`` that
    PostgreSQL can store: no NUL character or lone surrogate in any string or key (``core.storable``).
    Returns its size: the bytes of its JSON, which every byte cap counts."""
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"{what} must be JSON data: {exc}") from None
    limit = conf.MAX_PAYLOAD_BYTES
    size = len(encoded.encode())
    if size > limit:
        raise InvalidPayload(f"{what} is larger than {limit} bytes", too_large=True)
    if unstorable(payload):
        raise InvalidPayload(f"{what} must not contain {WHAT}")
    return size


def check_name(value: Any, what: str) -> None:
    """Thread names, concurrency keys and trigger ids: non-empty strings that a database can store."""
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidPayload(f"{what} must be a non-empty string of at most 200 characters")
    if unstorable(value):
        raise InvalidPayload(f"{what} must not contain {WHAT}")


def start_run(
    agent: str,
    payload: Any = None,
    *,
    source: str = "api",
    trigger: str = "api",
    keys: dict[str, Any] | None = None,
    thread: str | None = None,
    concurrency_key: str | None = None,
    attachments: list[Artifact | str] | None = None,
    created_by: Any = None,
    id: str | None = None,
    scope: str = "",
) -> Run:
    """Create a run and enqueue it after the surrounding transaction commits. Starting the same agent
    twice with the same ``id`` (trigger envelope id) in the same ``scope`` returns the first run.

    ``scope`` namespaces ``id``, ``concurrency_key`` and ``thread``: empty (the default) is global,
    on purpose, for code; the HTTP API passes the policy's scope of the caller, so a thread name one
    user sends is never another's. A ``thread`` belongs to the creator of its first run: joining one
    whose history ``created_by`` may not view raises ThreadForbidden, and nothing is created."""
    registry.get(agent)
    check_payload(payload)
    if keys is not None and not isinstance(keys, dict):
        raise InvalidPayload("keys must be an object")
    check_payload(keys, "keys")
    for value, what in ((thread, "thread"), (concurrency_key, "concurrency_key"), (id, "id")):
        check_name(value, what)
    creator = created_by if getattr(created_by, "pk", None) else None
    parts = []
    for item in attachments or []:
        artifact = item if isinstance(item, Artifact) else Artifact.objects.filter(pk=item).first()
        if artifact is None:
            raise InvalidPayload(f"attachment {item} does not exist")
        parts.append({"id": artifact.pk, "filename": artifact.filename, "media_type": artifact.media_type})
    envelope = {
        "id": id,
        "source": source,
        "trigger": trigger,
        "payload": payload,
        "keys": keys or {},
        "thread": thread,
        "receivedAt": timezone.now().isoformat(),
        "attachments": parts,
    }
    with transaction.atomic():
        if thread is not None:
            owner = store.thread_for(thread, creator, scope=scope)
            if not policy().can_view_thread(creator, owner):
                raise ThreadForbidden(f"thread {thread!r} belongs to someone else")
        run, created = store.create_run(
            agent=agent,
            trigger=envelope,
            trigger_id=id,
            scope=scope,
            concurrency_key=concurrency_key,
            thread=thread,
            created_by=creator,
        )
        if created:
            enqueue(run.pk)
    return run


def cancel_run(run_id: str, *, by: Any = None) -> str:
    """Cancel from any process. Returns ``cancelled`` when it settled at once, ``running`` when its
    owner will abort it within about a second, or the terminal status it already had. ``by`` (a
    user) is shown as the one who cancelled a waiting run's approval. Raises RunNotFound."""
    if store.cancel(run_id, by=by):
        # Only the call whose write settled the run announces it: of two racing cancels, one.
        return announce_settled(run_id).status
    return store.run(run_id).status


def _decide(approval_id: str, decision: str, by: Any, reason: str, token: str | None) -> WaitPoint:
    if not isinstance(reason, str) or unstorable(reason):
        raise InvalidPayload(f"reason must be a string without {WHAT}")
    with transaction.atomic():
        waitpoint = store.decide(approval_id, decision, by=by, reason=reason, token=token)
        enqueue(waitpoint.run_id)
    return waitpoint


def approve(approval_id: str, *, by: Any = None, reason: str = "", token: str | None = None) -> WaitPoint:
    """Approve once; the run is re-queued and runs the tool. Raises DecisionRefused otherwise."""
    return _decide(approval_id, WaitPoint.Decision.APPROVED, by, reason, token)


def deny(approval_id: str, *, by: Any = None, reason: str = "", token: str | None = None) -> WaitPoint:
    """Deny once; the model is told so as the tool's result. Raises DecisionRefused otherwise."""
    return _decide(approval_id, WaitPoint.Decision.DENIED, by, reason, token)


def send_input(run_id: str, payload: Any) -> RunInput:
    """Steer an active run: ``payload`` becomes a user message before its next model call. Raises
    InvalidPayload, RunNotFound, DecisionRefused (``run_settled``), or InputRefused: the run took
    ``MAX_INPUTS`` inputs (``too_many_inputs``), or its inputs not yet taken by a model call would
    pass ``MAX_PENDING_INPUT_BYTES`` (``inputs_pending``)."""
    if payload is None:
        raise InvalidPayload("payload is required: null is not an input")
    size = check_payload(payload)
    return store.add_input(
        run_id,
        payload,
        size=size,
        max_inputs=conf.MAX_INPUTS,
        max_pending_bytes=conf.MAX_PENDING_INPUT_BYTES,
    )
