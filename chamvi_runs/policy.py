"""Who may do what. Replace with ``CHAMVI_RUNS["POLICY"] = "myapp.policy.MyPolicy"`` (same methods;
subclass ``DefaultPolicy`` to change only some). ``decidable`` and ``can_answer`` are optional: see
``decidable_approvals`` and ``can_answer``."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db.models import QuerySet
from django.utils.module_loading import import_string

from .conf import conf
from .models import Run, Thread, WaitPoint


class DefaultPolicy:
    """The run's creator, or a user with the matching model permission."""

    def can_start(self, user: Any, agent: str) -> bool:
        return bool(user.is_authenticated and user.has_perm("chamvi_runs.add_run"))

    def can_view(self, user: Any, run: Run) -> bool:
        return self._owner(user, run) or bool(user.is_authenticated and user.has_perm("chamvi_runs.view_run"))

    def can_steer(self, user: Any, run: Run) -> bool:
        """Send input to the run."""
        return self._owner(user, run) or bool(
            user.is_authenticated and user.has_perm("chamvi_runs.change_run")
        )

    def can_cancel(self, user: Any, run: Run) -> bool:
        return self._owner(user, run) or bool(
            user.is_authenticated and user.has_perm("chamvi_runs.cancel_run")
        )

    def can_decide(self, user: Any, run: Run) -> bool:
        return self._approver(user)

    def can_answer(self, user: Any, run: Run) -> bool:
        """Answer the run's questions (``human_tool``): they are asked of its user, so its creator
        answers them, not the approvers."""
        return self._owner(user, run)

    def decidable(self, user: Any, waitpoints: QuerySet[WaitPoint]) -> QuerySet[WaitPoint]:
        """Those of ``waitpoints`` whose runs ``user`` may decide, as a filter of the query: the
        approvals page pages it in the database. It must agree with ``can_decide``. Here all or
        none (``none()`` costs no query): the permission does not depend on the run."""
        return waitpoints if self._approver(user) else waitpoints.none()

    def can_view_thread(self, user: Any, thread: Thread) -> bool:
        """View the thread's history, and so start runs in it. ``user`` None is code that started a
        run without ``created_by``: it may join a thread of nobody's only."""
        if user is None:
            return thread.owner_id is None
        if not user.is_authenticated:
            return False
        if thread.owner_id is not None and thread.owner_id == user.pk:
            return True
        return bool(user.has_perm("chamvi_runs.view_run"))

    def scope(self, user: Any) -> str:
        """The namespace of concurrency keys and trigger ids sent over HTTP by ``user``: users never
        share one (return a tenant id here to let a team share its keys)."""
        return f"user:{user.pk}"

    @staticmethod
    def _approver(user: Any) -> bool:
        return bool(
            user is not None and user.is_authenticated and user.has_perm("chamvi_runs.approve_waitpoint")
        )

    @staticmethod
    def _owner(user: Any, run: Run) -> bool:
        return bool(
            user is not None
            and user.is_authenticated
            and run.created_by_id is not None
            and run.created_by_id == user.pk
        )


@cache
def _load(path: str) -> Any:
    return import_string(path)()


def policy() -> Any:
    return _load(conf.POLICY)


def decidable_approvals(user: Any, waitpoints: QuerySet[WaitPoint]) -> QuerySet[WaitPoint] | None:
    """``policy().decidable(user, waitpoints)``, or None when the site's policy cannot say it as a
    query: it has no ``decidable``, or it inherits ``DefaultPolicy``'s while it overrides
    ``can_decide``, which that one would contradict. The caller then asks ``can_decide`` row by row,
    over a page of bounded size."""
    current = policy()
    method = getattr(current, "decidable", None)
    if method is None:
        return None
    kind = type(current)
    if kind.decidable is DefaultPolicy.decidable and kind.can_decide is not DefaultPolicy.can_decide:
        return None
    result: QuerySet[WaitPoint] = method(user, waitpoints)
    return result


def can_answer(user: Any, run: Run) -> bool:
    """``policy().can_answer(user, run)``; a site's policy written before questions existed has
    none, and then the run's creator answers, as ``DefaultPolicy`` says."""
    method = getattr(policy(), "can_answer", None)
    if method is None:
        return DefaultPolicy._owner(user, run)
    return bool(method(user, run))
