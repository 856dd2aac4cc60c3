"""A thread's current branch (SPEC §12), as a pure function of its runs; ``client.js`` applies the
same rule to the runs it is shown.

A thread's next run goes on from the run created before it. A regenerate or a resend of run X
starts from the history X started from (X's parent): X and the runs after it, up to the new run,
are off the branch. A fork (``from_step``) goes on from the run it was forked from (from that run's
parent, when forked from the history it started from). So each run has one parent, and the current
branch is the chain of parents from the newest run back; the history a run starts from is its
parent's (``runtime.start_point``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    """A run of a thread, as its branch sees it."""

    id: str
    replaces: str | None = None
    forked_from: str | None = None
    """The run whose history this run was forked from (``from_step``)."""
    from_start: bool = False
    """Forked from the history ``forked_from`` started from (step -1), not from one of its steps."""


def parents(runs: Sequence[Node]) -> dict[str, str | None]:
    """Run id -> the run whose history it goes on from (None: the first). ``runs`` in creation order."""
    position = {run.id: n for n, run in enumerate(runs)}

    def before(run_id: str) -> str | None:
        at = position.get(run_id)
        return runs[at - 1].id if at else None

    # A run's parent is created before it: in creation order, every parent is known when asked for.
    out: dict[str, str | None] = {}
    for run in runs:
        if run.forked_from is not None:
            inside = run.forked_from in position
            out[run.id] = (out[run.forked_from] if run.from_start else run.forked_from) if inside else None
        elif run.replaces is not None and run.replaces in position:
            # Where the replaced run started from (itself a replacement, maybe).
            out[run.id] = out[run.replaces]
        else:
            out[run.id] = before(run.id)
    return out


def current_branch(runs: Sequence[Node]) -> list[str]:
    """The ids of the runs on the thread's current branch, oldest first (``runs`` in creation order)."""
    if not runs:
        return []
    up = parents(runs)
    chain: list[str] = []
    seen: set[str] = set()
    at: str | None = runs[-1].id
    while at is not None and at not in seen:
        seen.add(at)
        chain.append(at)
        at = up[at]
    return chain[::-1]
