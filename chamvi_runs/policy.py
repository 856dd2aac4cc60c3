"""Who may do what. Replace with ``CHAMVI_RUNS["POLICY"] = "myapp.policy.MyPolicy"`` (same methods)."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.utils.module_loading import import_string

from .conf import conf
from .models import Run


class DefaultPolicy:
    """The run's creator, or a user with the matching model permission."""

    def can_start(self, user: Any, agent: str) -> bool:
        return bool(user.is_authenticated and user.has_perm("chamvi_runs.add_run"))

    def can_view(self, user: Any, run: Run) -> bool:
        return self._owner(user, run) or user.has_perm("chamvi_runs.view_run")

    def can_steer(self, user: Any, run: Run) -> bool:
        """Send input to and cancel the run."""
        return self._owner(user, run) or user.has_perm("chamvi_runs.change_run")

    def can_decide(self, user: Any, run: Run) -> bool:
        return bool(user.is_authenticated and user.has_perm("chamvi_runs.approve_waitpoint"))

    @staticmethod
    def _owner(user: Any, run: Run) -> bool:
        return bool(user.is_authenticated and run.created_by_id is not None and run.created_by_id == user.pk)


@cache
def _load(path: str) -> Any:
    return import_string(path)()


def policy() -> Any:
    return _load(conf.POLICY)
