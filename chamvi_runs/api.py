"""The Python API: start, steer, cancel and decide runs from any process."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import signals, store
from .agents.agent import RunContext, registry
from .agents.tools import Tool, to_jsonable
from .conf import conf
from .core.records import arguments_hash
from .core.states import TERMINAL
from .core.storable import WHAT, unstorable
from .dispatch.doorbell import enqueue
from .errors import (
    AgentNotFound,
    DecisionRefused,
    HistoryUnavailable,
    InvalidAnswer,
    InvalidPayload,
    RunNotFound,
    ThreadForbidden,
    ToolArgumentsError,
)
from .models import Artifact, Run, RunInput, Thread, WaitPoint
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
    from_step: tuple[str, int] | None = None,
) -> Run:
    """Create a run and enqueue it after the surrounding transaction commits. Starting the same agent
    twice with the same ``id`` (trigger envelope id) in the same ``scope`` returns the first run.

    ``from_step`` (run id, step index) forks: the run's history is that run's history after that
    step (-1: the history that run started from), then its own trigger message, instead of its
    thread's latest. Raises RunNotFound, or HistoryUnavailable when that history cannot be rebuilt.

    ``scope`` namespaces ``id``, ``concurrency_key`` and ``thread``: empty (the default) is global,
    on purpose, for code; the HTTP API passes the policy's scope of the caller, so a thread name one
    user sends is never another's. A ``thread`` belongs to the creator of its first run: joining one
    whose history ``created_by`` may not view raises ThreadForbidden, and nothing is created."""
    registry.get(agent)
    base = _fork_point(from_step) if from_step is not None else None
    return _start(
        agent,
        payload,
        source=source,
        trigger=trigger,
        keys=keys,
        thread=thread,
        concurrency_key=concurrency_key,
        attachments=attachments,
        created_by=created_by,
        id=id,
        scope=scope,
        base=base,
    )


def _fork_point(from_step: Any) -> tuple[str, int]:
    if (
        not isinstance(from_step, tuple | list)
        or len(from_step) != 2
        or not isinstance(from_step[0], str)
        or not isinstance(from_step[1], int)
        or isinstance(from_step[1], bool)
        or from_step[1] < -1
    ):
        raise InvalidPayload("from_step must be (run id, step index), the index -1 or more")
    run_id, index = from_step
    if unstorable(run_id) or not Run.objects.filter(pk=run_id).exists():
        raise RunNotFound(run_id)
    if store.history(run_id, index) is None:
        raise HistoryUnavailable(f"run {run_id} has saved no step yet: it has no history to fork")
    return run_id, index


def _start(
    agent: str,
    payload: Any,
    *,
    source: str,
    trigger: str,
    keys: dict[str, Any] | None,
    thread: str | None,
    concurrency_key: str | None,
    attachments: list[Artifact | str] | None,
    created_by: Any,
    id: str | None,
    scope: str,
    base: tuple[str, int] | None = None,
    replaces: Run | None = None,
) -> Run:
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
    # What receivers want every execution to know of where the run came from (its trace).
    carrier: dict[str, str] = {}
    signals.run_creating.send(Run, agent=agent, carrier=carrier)
    with transaction.atomic():
        if thread is not None:
            owner = store.thread_for(thread, creator, scope=scope)
            if not policy().can_view_thread(creator, owner):
                raise ThreadForbidden(f"thread {thread!r} belongs to someone else")
        run, created = store.create_run(
            agent=agent,
            agent_version=registry.get(agent).version,
            trigger=envelope,
            trigger_id=id,
            scope=scope,
            concurrency_key=concurrency_key,
            thread=thread,
            created_by=creator,
            base_id=base[0] if base is not None else None,
            base_step=base[1] if base is not None else None,
            replaces=replaces,
            trace_context=carrier or None,
        )
        if created:
            enqueue(run.pk, (run.agent, run.agent_version))
    return run


def regenerate(run_id: str, *, by: Any = None) -> Run:
    """Answer again: a new run in the same thread, with the same trigger, whose history is the one
    ``run_id`` started from. The thread goes on from the new run; ``run_id`` stays readable and
    names it (``replaced_by``). What ``run_id``'s tools did is not undone. The new run is created
    by ``run_id``'s creator (the conversation stays theirs); ``by`` must be able to view the
    thread. Raises RunNotFound,
    DecisionRefused (``run_active``: only a settled run is regenerated), HistoryUnavailable, or
    ThreadForbidden (``by`` may not view the thread)."""
    old = _replaceable(run_id)
    return _again(old, old.trigger.get("payload"), by)


def resend(run_id: str, payload: Any, *, by: Any = None) -> Run:
    """Edit an earlier message: a new run in ``run_id``'s thread, from the history ``run_id``
    started from, with ``payload`` as its trigger's. The thread goes on from the new run. Raises as
    ``regenerate`` does, and InvalidPayload."""
    old = _replaceable(run_id)
    return _again(old, payload, by)


def _replaceable(run_id: str) -> Run:
    old = None if unstorable(run_id) else Run.objects.filter(pk=run_id).first()
    if old is None:
        raise RunNotFound(run_id)
    if old.status not in TERMINAL:
        raise DecisionRefused(
            f"run {run_id} is {old.status}: only a settled run is answered again", code="run_active"
        )
    if store.history(run_id, -1) is None:
        raise HistoryUnavailable(f"run {run_id} saved no step: there is no history to start from again")
    return old


def _again(old: Run, payload: Any, by: Any) -> Run:
    if by is not None and old.thread is not None:
        owner = Thread.objects.filter(scope=old.scope, name=old.thread).first()
        if owner is not None and not policy().can_view_thread(by, owner):
            raise ThreadForbidden(f"thread {old.thread!r} belongs to someone else")
    trigger = old.trigger
    return _start(
        old.agent,
        payload,
        source=trigger.get("source", "api"),
        trigger=trigger.get("trigger", "api"),
        keys=trigger.get("keys") or {},
        thread=old.thread,
        concurrency_key=old.concurrency_key,
        attachments=[a["id"] for a in trigger.get("attachments") or [] if isinstance(a, dict) and "id" in a],
        # The conversation stays its user's, whoever asks (an operator may regenerate for them).
        created_by=old.created_by,
        id=None,
        scope=old.scope,
        base=(old.pk, -1),
        replaces=old,
    )


def cancel_run(run_id: str, *, by: Any = None) -> str:
    """Cancel from any process. Returns ``cancelled`` when it settled at once, ``running`` when its
    owner will abort it within about a second, or the terminal status it already had. ``by`` (a
    user) is shown as the one who cancelled a waiting run's approval. Raises RunNotFound."""
    if store.cancel(run_id, by=by):
        # Only the call whose write settled the run announces it: of two racing cancels, one.
        return announce_settled(run_id).status
    return store.run(run_id).status


def _decide(
    approval_id: str, decision: str, by: Any, reason: str, token: str | None, **recorded: Any
) -> WaitPoint:
    if not isinstance(reason, str) or unstorable(reason):
        raise InvalidPayload(f"reason must be a string without {WHAT}")
    with transaction.atomic():
        waitpoint = store.decide(approval_id, decision, by=by, reason=reason, token=token, **recorded)
        if waitpoint.resumes:
            enqueue(waitpoint.run_id)
    return waitpoint


def _tool_of(approval_id: str) -> tuple[WaitPoint, Tool | None]:
    """The wait point and the tool it waits on, as its run's agent has it now (None: the agent or
    the tool is gone, e.g. after a deploy)."""
    waitpoint = WaitPoint.objects.select_related("run").filter(approval_id=approval_id).first()
    if waitpoint is None:
        raise DecisionRefused(f"no approval {approval_id}", code="not_found")
    try:
        agent = registry.get(waitpoint.run.agent)
    except AgentNotFound:
        return waitpoint, None
    return waitpoint, agent.assemble_tools(RunContext(run=waitpoint.run, agent=agent)).get(
        waitpoint.tool_name
    )


def approve(
    approval_id: str,
    *,
    by: Any = None,
    reason: str = "",
    token: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> WaitPoint:
    """Approve once; the run is re-queued and runs the tool. ``arguments``: what the tool runs with
    instead of what the model proposed (validated against the tool's schema; the model is told what
    changed). Raises DecisionRefused, or InvalidAnswer (``invalid_arguments``, ``not_editable``):
    nothing was recorded."""
    approved = None
    if arguments is not None:
        approved = _edited_arguments(approval_id, arguments)
    return _decide(approval_id, WaitPoint.Decision.APPROVED, by, reason, token, approved_input=approved)


def _edited_arguments(approval_id: str, arguments: Any) -> dict[str, Any] | None:
    if not isinstance(arguments, dict):
        raise InvalidAnswer("arguments must be an object", code="invalid_arguments")
    check_payload(arguments, "arguments")
    waitpoint, tool = _tool_of(approval_id)
    if waitpoint.kind != WaitPoint.Kind.APPROVAL:
        raise DecisionRefused(f"{approval_id} is a question: it is answered, not approved", code="wrong_kind")
    if not waitpoint.editable:
        raise InvalidAnswer(
            f"the arguments of {waitpoint.tool_name} cannot be changed before approving", code="not_editable"
        )
    if tool is None:
        raise InvalidAnswer(
            f"the agent no longer has {waitpoint.tool_name}: its arguments cannot be checked",
            code="not_editable",
        )
    try:
        validated = to_jsonable(tool.validate(json.dumps(arguments)))
    except ToolArgumentsError as exc:
        raise InvalidAnswer(str(exc), code="invalid_arguments") from None
    # Approving the proposal as it was is a plain approval: nothing changed, nothing to tell.
    return None if arguments_hash(validated) == waitpoint.arguments_hash else validated


def deny(approval_id: str, *, by: Any = None, reason: str = "", token: str | None = None) -> WaitPoint:
    """Deny once; the model is told so as the tool's result. Raises DecisionRefused otherwise."""
    return _decide(approval_id, WaitPoint.Decision.DENIED, by, reason, token)


def answer(approval_id: str, answer: Any, *, by: Any = None, token: str | None = None) -> WaitPoint:
    """Answer a question (a ``human_tool`` call) once: the answer, validated against the question's
    ``answer_schema``, becomes the tool's result, and the run goes on once every question it asked
    together is answered. Raises InvalidAnswer (``invalid_answer``, naming the field),
    InvalidPayload, or DecisionRefused (``not_found``, ``already_decided``, ``expired``,
    ``wrong_kind``): nothing was recorded."""
    check_payload(answer, "answer")
    waitpoint, tool = _tool_of(approval_id)
    if waitpoint.kind != WaitPoint.Kind.INPUT:
        raise DecisionRefused(
            f"{approval_id} is an approval: it is approved or denied, not answered", code="wrong_kind"
        )
    # A question whose tool is gone (a deploy removed it) takes any answer: the model asked it.
    value = tool.question.validate(answer) if tool is not None and tool.question is not None else answer
    return _decide(approval_id, WaitPoint.Decision.ANSWERED, by, "", token, answer=value)


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
