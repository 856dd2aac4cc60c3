"""A run's place in its thread as the pages show it (SPEC §12: regenerate, edit and resend, forks):
what it replaces or was forked from and what replaced it, the runs it goes on from, the runs its
thread's current branch leaves out, and whether a user may regenerate it or resend it edited."""

from __future__ import annotations

from typing import Any

from ..core.branches import Node, current_branch, parents
from ..models import Run
from ..policy import policy
from ..store import queries
from .consumers import THREAD_REPLAY_RUNS
from .wait_display import canonical

# How many earlier runs of its thread a run page shows above it, and runs a thread page shows: as
# many as the thread socket replays, or the page would take older replayed runs for new ones.
THREAD_RUNS = THREAD_REPLAY_RUNS

# How a run that replaces another says so: by whether it kept the trigger's payload (a regenerate)
# or was sent with another (an edited message).
REGENERATED = "Regenerated from"
EDITED = "Edited from"


def may_again(user: Any, run: Run) -> bool:
    """Whether ``user`` may regenerate ``run`` or resend it with an edited message (the API asks the
    same: ``can_steer`` the run and ``can_start`` its agent); whether it is settled yet is the
    page's to follow, live."""
    return bool(policy().can_steer(user, run) and policy().can_start(user, run.agent))


def trigger_payloads(run_ids: set[str]) -> dict[str, Any]:
    """The trigger payloads of ``run_ids`` (those that still exist)."""
    if not run_ids:
        return {}
    rows = Run.objects.filter(pk__in=run_ids).values_list("pk", "trigger")
    return {pk: (trigger or {}).get("payload") for pk, trigger in rows}


def lineage_notes(run: Run, replaced: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What a run's page (and its summary on a thread page) says of the runs it replaces or was
    forked from: each ``{"text", "run_id", "step"?}``, ``run_id`` linked. ``replaced``: the payloads
    of the runs it may replace, read at once for a whole thread."""
    notes: list[dict[str, Any]] = []
    if run.replaces_id:
        payloads = replaced if replaced is not None else trigger_payloads({run.replaces_id})
        if run.replaces_id in payloads:
            same = canonical(payloads[run.replaces_id]) == canonical((run.trigger or {}).get("payload"))
            notes.append({"text": REGENERATED if same else EDITED, "run_id": run.replaces_id})
        else:
            notes.append({"text": "Replaces", "run_id": run.replaces_id})
    elif run.base_id:
        notes.append({"text": "Forked from", "run_id": run.base_id, "step": fork_point(run.base_step)})
    return notes


def fork_point(step: int | None) -> str:
    """Where in its base run a fork starts, as the run page says it."""
    if step is None or step < 0:
        return "before its first step"
    return f"at step {step}"


def replaced_by(run: Run) -> Run | None:
    """The newest run that regenerates or resends ``run`` (the run JSON's ``replaced_by``)."""
    return Run.objects.filter(replaces_id=run.pk).order_by("-created_at", "-id").only("id", "agent").first()


def branch_of(run: Run) -> tuple[list[str], bool]:
    """The ids of the runs ``run`` goes on from in its thread (its parents, oldest first, without
    it), and whether it is on the thread's current branch."""
    nodes = queries.thread_nodes(run.thread or "", run.scope)
    up = parents(nodes)
    chain: list[str] = []
    at = up.get(run.pk)
    while at is not None and at not in chain:
        chain.append(at)
        at = up.get(at)
    return chain[::-1], run.pk in current_branch(nodes)


def in_order(ids: list[str]) -> list[Run]:
    """The runs of ``ids`` (those that exist), in the order of ``ids``."""
    found = Run.objects.select_related("created_by").in_bulk(ids)
    return [found[i] for i in ids if i in found]


def off_branch(user: Any, nodes: list[Node], branch: list[str]) -> list[dict[str, Any]]:
    """The runs of a thread (``nodes``) its current branch leaves out (regenerated, edited, or after
    those), oldest first, the latest ``THREAD_RUNS`` of them the user may view: each with the newest
    run that replaced it, if one did."""
    on_branch = set(branch)
    off = [n.id for n in nodes if n.id not in on_branch][-THREAD_RUNS:]
    newest: dict[str, str] = {}
    replacing = Run.objects.filter(replaces_id__in=off).order_by("created_at", "id")
    for old, new in replacing.values_list("replaces_id", "pk"):
        newest[old] = new
    return [
        {"run": run, "message": (run.trigger or {}).get("payload"), "replaced_by": newest.get(run.pk)}
        for run in in_order(off)
        if policy().can_view(user, run)
    ]
