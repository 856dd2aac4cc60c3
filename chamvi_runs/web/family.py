"""The child runs (SPEC §13) a socket or a stream of a run carries besides its own: the runs below
it that its viewer may view. Their events come on the run's group, each naming its parent."""

from __future__ import annotations

from typing import Any

from .. import store
from ..models import Run
from ..policy import policy


def visible_below(viewer: Any, *run_ids: str) -> dict[str, bool]:
    """The runs below ``run_ids`` (children before theirs, oldest first), each with whether
    ``viewer`` may view it."""
    below = store.descendants(*run_ids)
    runs = {run.pk: run for run in Run.objects.filter(pk__in=below)}
    return {pk: pk in runs and bool(policy().can_view(viewer, runs[pk])) for pk in below}


class Family:
    """The runs below ``run_id``, each with whether the viewer (as each call names them) may view
    it: those known as the socket or stream opens (``look``), then each that a live event names
    (``shows``), looked up once."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.below: dict[str, bool] = {}

    def look(self, viewer: Any) -> list[str]:
        """The visible runs below, as they are now."""
        self.below = visible_below(viewer, self.run_id)
        return [run_id for run_id, visible in self.below.items() if visible]

    def shows(self, run_id: str, viewer: Any) -> bool:
        """Whether a run whose event came on the group is one below that ``viewer`` may view."""
        if run_id not in self.below:
            run = Run.objects.filter(pk=run_id).first()
            self.below[run_id] = (
                run is not None and store.is_below(run, self.run_id) and bool(policy().can_view(viewer, run))
            )
        return self.below[run_id]
