"""``ws/chamvi/threads/<thread>/``: every run of a thread, as ``consumers.RunConsumer`` serves one."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.db.models import Q, QuerySet

from .. import store
from ..core.storable import unstorable
from ..models import Run
from ..policy import policy
from ..streaming.broadcast import events_of, thread_group
from . import threads
from .consumers import FORBIDDEN, THREAD_REPLAY_RUNS, RunConsumer
from .family import visible_below
from .socket_commands import is_id
from .socket_query import after_of, query_of, resume_of


class ThreadConsumer(RunConsumer):
    """``ws/chamvi/threads/<thread>/``: the events of every run of a thread the user may view.

    The name is looked up as the thread page looks it up (``web.threads``): in ``?scope=`` when the
    query names one, else in the user's own scope, then the global one. Open to the thread's owner,
    to whom ``policy().can_view_thread`` allows, and to any authenticated user before the thread's
    first run: the socket then follows the name in each of those scopes, so the first run is seen
    whether it is started over HTTP or by the site's code. Runs the user may not view are neither
    replayed nor forwarded live."""

    async def connect(self) -> None:
        if not await self._accepted():
            return
        self.thread: str = self.scope["url_route"]["kwargs"]["thread"]
        query = query_of(self.scope)
        self.named: str | None = query.get("scope", [None])[0]
        self.scopes: list[str] = await database_sync_to_async(self._followed)()
        if not self.scopes:
            await self.close(code=FORBIDDEN)
            return
        seqs = await self._query(lambda query: (after_of(query), resume_of(query)))
        if seqs is None:
            return
        after, resume = seqs
        self.visible: dict[str, bool] = await database_sync_to_async(self._visibility)(resume)
        runs = {run_id: resume.get(run_id, after) for run_id, visible in self.visible.items() if visible}
        # The child runs of those runs (SPEC §13), from their start unless the client resumes them.
        for child in await database_sync_to_async(self._children_of)(list(runs)):
            runs[child] = resume.get(child, 0)
        await self._open([thread_group(self.thread, scope) for scope in self.scopes], runs)

    def _followed(self) -> list[str]:
        """The scopes whose thread of this name the socket follows; none: it may not watch."""
        user = self.viewer
        # PostgreSQL cannot compare a NUL or a lone surrogate, and no thread has one in its name.
        if not user.is_authenticated or unstorable(self.thread) or unstorable(self.named or ""):
            return []
        thread = threads.find(user, self.thread, self.named)
        if thread is None:
            return threads.scopes_of(user, self.named)
        owner = thread.owner_id is not None and thread.owner_id == user.pk
        return [thread.scope] if owner or policy().can_view_thread(user, thread) else []

    def _watchable(self) -> bool:
        return bool(self._followed())

    def _of_thread(self) -> QuerySet[Run]:
        in_scopes = Q(pk__in=[])
        for scope in self.scopes:
            in_scopes |= Q(scope=scope)
        return Run.objects.filter(in_scopes, thread=self.thread)

    def _visibility(self, resume: dict[str, int]) -> dict[str, bool]:
        """The latest ``THREAD_REPLAY_RUNS`` runs of the thread and those of ``resume`` (a client
        that shows an older run still going), oldest first: may the user view each?"""
        of_thread = self._of_thread()
        runs = {run.pk: run for run in of_thread.order_by("-created_at", "-id")[:THREAD_REPLAY_RUNS]}
        if resume:
            runs.update((run.pk, run) for run in of_thread.filter(pk__in=list(resume)))
        ordered = sorted(runs.values(), key=lambda run: (run.created_at, run.pk))
        return {run.pk: bool(policy().can_view(self.viewer, run)) for run in ordered}

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        for event in events_of(message):
            run_id = event.get("run_id", "")
            if run_id not in self.visible:
                # A run started in the thread after this socket connected, or one older than the replay.
                self.visible[run_id] = await database_sync_to_async(self._can_view)(run_id)
                if self.visible[run_id]:
                    self.cursor.follow(run_id)
            if self.visible[run_id]:
                await self._deliver(event)

    def _children_of(self, run_ids: list[str]) -> list[str]:
        """The runs below ``run_ids`` its user may view (``visible`` remembers each)."""
        below = visible_below(self.viewer, *run_ids)
        self.visible.update(below)
        return [pk for pk, visible in below.items() if visible]

    def _target(self, content: dict[str, Any]) -> Run | None:
        """A steering message on a thread socket names its run, which must be of this thread."""
        run_id = content.get("run_id")
        if not is_id(run_id):
            return None
        return self._of_thread().filter(pk=run_id).first()

    def _covers(self, run: Run) -> bool:
        if run.parent_id is not None:
            # A child run has no thread: it is of the thread of the run at the top of its family.
            _above, thread, scope = store.ancestors(run)
            return thread == self.thread and scope in self.scopes
        return run.thread == self.thread and run.scope in self.scopes
