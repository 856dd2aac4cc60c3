"""How one execution ended (``runtime.engine``): what it wrote last, or that it could write nothing.

Each step of the loop returns None to go on, or the ending; ``Execution.run`` acts on it in one
place. ``Settled`` and ``Waiting`` were written (and announced) by the write that ended the
execution; ``Abandoned`` wrote nothing, and becomes the ``LeaseLostError`` that the
``execution_error`` signal, the log and the metrics report.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import Claim
from .states import Status


@dataclass(frozen=True)
class Settled:
    """The run's status is written and announced: a terminal one, or ``interrupted`` (drained)."""

    status: Status


@dataclass(frozen=True)
class Waiting:
    """The run waits for a person: its wait points are open (announced by ``run.waiting``), or it
    went back to the ones still undecided."""


@dataclass(frozen=True)
class Abandoned:
    """The claim is lost (another worker may hold the run): nothing more was written."""

    reason: str


Ending = Settled | Waiting | Abandoned
"""The execution is over: each step returns it up the loop."""


def lost(claim: Claim, when: str) -> Abandoned:
    """A write fenced on ``claim`` was refused, ``when`` says at what point of the execution."""
    return Abandoned(f"run {claim.run_id}: {when}")
