"""Child runs (SPEC §13): started with the wait that the parent's delegating calls open, and
settled into it. Lock order, as everywhere: the parent's run row, then its wait points; a child's
settle has committed before its parent is touched, so no transaction holds a child's row and then
its parent's."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from ..core.records import Claim, WaitRequest
from ..core.states import TERMINAL, Status
from ..core.storable import storable
from ..models import Run, WaitPoint
from .fence import to

ACTIVE = [s.value for s in Status if s not in TERMINAL]


def envelope(payload: Any) -> dict[str, Any]:
    """A child's trigger envelope: what ``start_run`` would build for ``source`` and ``trigger``
    ``run``, with no thread (a child has a history of its own, not its parent's)."""
    return {
        "id": None,
        "source": "run",
        "trigger": "run",
        "payload": payload,
        "keys": {},
        "thread": None,
        "receivedAt": timezone.now().isoformat(),
        "attachments": [],
    }


def start_children(claim: Claim, waits: list[WaitRequest]) -> dict[int, Run]:
    """Inside the transaction that opens the parent's waits: one queued child run per delegating
    call (position -> run), created by the parent's creator in the parent's scope, one level
    deeper. At most one per call, whatever happens (``chamvi_run_one_child_per_call``): the
    children and the wait step that starts them commit together or not at all."""
    delegated = [(w, w.delegate) for w in waits if w.kind == WaitPoint.Kind.CHILD and w.delegate]
    if not delegated:
        return {}
    parent = Run.objects.only("scope", "created_by_id", "depth", "trace_context").get(pk=claim.run_id)
    children = [
        Run(
            status=Status.QUEUED,
            agent=agent,
            agent_version=wait.delegate_version,
            trigger=envelope(storable(wait.input)),
            scope=parent.scope,
            created_by_id=parent.created_by_id,
            parent_id=claim.run_id,
            parent_step=wait.call.model_step,
            parent_position=wait.call.position,
            depth=parent.depth + 1,
            # Its executions carry on where its parent came from (one trace for the whole family).
            trace_context=parent.trace_context,
        )
        for wait, agent in delegated
    ]
    # One INSERT for all of them (their ids are made in Python: nothing to read back).
    Run.objects.bulk_create(children)
    return {wait.call.position: child for (wait, _agent), child in zip(delegated, children, strict=True)}


def _result(child: Run) -> dict[str, Any]:
    """How a settled child decides its parent's wait: its output, or why it has none."""
    if child.status == Status.COMPLETED:
        return {"decision": WaitPoint.Decision.ANSWERED, "answer": storable(child.output)}
    why = f"{child.error_code}: {child.error_message}" if child.error_code else child.status
    return {
        "decision": WaitPoint.Decision.FAILED,
        "reason": storable(f"the {child.agent} run {child.pk} ended {child.status} ({why})"),
    }


def settle_into_parent(child: Run) -> str | None:
    """After a child's terminal settle has committed: its output (or error) decides the parent's
    wait for it, its usage joins the parent's, and once the parent waits for no other wait point
    it is running again (unclaimed). Returns the parent's id when it is to be enqueued. Done once:
    a second call (a repair by ``chamvi_tick`` racing the child's own) finds the wait decided."""
    if child.parent_id is None or child.status not in TERMINAL:
        return None
    try:
        with transaction.atomic():
            # The parent's row first (the lock order), taking the child's usage with it: undone
            # below when the wait turns out decided already.
            if not Run.objects.filter(pk=child.parent_id).update(
                input_tokens=F("input_tokens") + child.input_tokens,
                output_tokens=F("output_tokens") + child.output_tokens,
                updated_at=Now(),
            ):
                return None
            if not WaitPoint.objects.filter(
                run_id=child.parent_id, child_id=child.pk, decision__isnull=True
            ).update(decided_at=Now(), **_result(child)):
                raise _Decided  # decided already, or the parent was cancelled meanwhile
            # Running again (unclaimed) once it waits for nothing else.
            open_waits = WaitPoint.objects.filter(run_id=OuterRef("pk"), decision__isnull=True)
            resumed = (
                Run.objects.filter(to(Status.RUNNING), pk=child.parent_id, status=Status.WAITING)
                .filter(~Exists(open_waits))
                .update(status=Status.RUNNING, updated_at=Now())
            )
    except _Decided:
        return None
    return child.parent_id if resumed else None


class _Decided(Exception):
    """Rolls back a child's settle into a parent whose wait for it is decided already."""


def ancestors(run: Run) -> tuple[list[str], str | None, str]:
    """The runs above a child run, nearest first, with the thread and scope of the topmost: where
    the child's events go besides its own group. Nothing above a run nobody delegated to."""
    above: list[str] = []
    thread, scope = run.thread, run.scope
    parent_id = run.parent_id
    while parent_id is not None and parent_id not in above:
        row = Run.objects.filter(pk=parent_id).values("parent_id", "thread", "scope").first()
        if row is None:
            break
        above.append(parent_id)
        thread, scope, parent_id = row["thread"], row["scope"], row["parent_id"]
    return above, thread, scope


def descendants(*run_ids: str) -> list[str]:
    """Every run below ``run_ids``, children before their children, oldest first: a query per
    level of delegation (at most ``MAX_CHILD_DEPTH``), however many runs."""
    found: list[str] = []
    level = list(run_ids)
    while level:
        level = list(
            Run.objects.filter(parent_id__in=level).order_by("created_at", "id").values_list("pk", flat=True)
        )
        level = [pk for pk in level if pk not in found]
        found.extend(level)
    return found


def is_below(run: Run, run_id: str) -> bool:
    """Whether ``run`` was delegated, directly or not, by the run ``run_id``."""
    return run_id in ancestors(run)[0]


def orphans() -> list[str]:
    """Active child runs whose parent has settled: the process that settled the parent died before
    it cancelled them (``chamvi_tick`` does)."""
    settled = [s.value for s in TERMINAL]
    return list(
        Run.objects.filter(parent__status__in=settled, status__in=ACTIVE).values_list("pk", flat=True)[:500]
    )


def active_children(run_id: str) -> list[str]:
    """The children of ``run_id`` that have not settled."""
    return list(Run.objects.filter(parent_id=run_id, status__in=ACTIVE).values_list("pk", flat=True))


def settled_unannounced() -> list[Run]:
    """Settled children whose parent still waits for them: the process died between the child's
    settle and its parent's wake-up (``chamvi_tick`` repairs it)."""
    waits = WaitPoint.objects.filter(
        kind=WaitPoint.Kind.CHILD, decision__isnull=True, child__status__in=[s.value for s in TERMINAL]
    )
    return list(Run.objects.filter(pk__in=waits.values("child_id")))
