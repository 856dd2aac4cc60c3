"""``ws/chamvi/threads/<thread>/``: every run of a thread, as ``consumers.RunConsumer`` serves one."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from ..core.storable import unstorable
from ..models import Run, Thread
from ..policy import policy
from ..streaming.broadcast import events_of, thread_group
from .consumers import FORBIDDEN, THREAD_REPLAY_RUNS, RunConsumer
from .socket_commands import is_id
from .socket_query import after_of, resume_of


class ThreadConsumer(RunConsumer):
    """``ws/chamvi/threads/<thread>/``: the events of every run of a thread the user may view.

    Open to the thread's owner (also before its first run), to any authenticated user while the
    thread has no owner record yet, and otherwise to whom ``policy().can_view_thread`` allows. Runs
    the user may not view are neither replayed nor forwarded live."""

    async def connect(self) -> None:
        if not await self._accepted():
            return
        self.thread: str = self.scope["url_route"]["kwargs"]["thread"]
        # PostgreSQL cannot compare a NUL or a lone surrogate, and no thread has one in its name.
        if unstorable(self.thread) or not await database_sync_to_async(self._watchable)():
            await self.close(code=FORBIDDEN)
            return
        seqs = await self._query(lambda query: (after_of(query), resume_of(query)))
        if seqs is None:
            return
        after, resume = seqs
        self.visible: dict[str, bool] = await database_sync_to_async(self._visibility)(resume)
        runs = {run_id: resume.get(run_id, after) for run_id, visible in self.visible.items() if visible}
        await self._open(thread_group(self.thread), runs)

    def _watchable(self) -> bool:
        user = self.viewer
        if not user.is_authenticated:
            return False
        thread = Thread.objects.filter(name=self.thread).first()
        if thread is None or (thread.owner_id is not None and thread.owner_id == user.pk):
            return True
        return bool(policy().can_view_thread(user, thread))

    def _visibility(self, resume: dict[str, int]) -> dict[str, bool]:
        """The latest ``THREAD_REPLAY_RUNS`` runs of the thread and those of ``resume`` (a client
        that shows an older run still going), oldest first: may the user view each?"""
        of_thread = Run.objects.filter(thread=self.thread)
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
                    self.active.add(run_id)
            if self.visible[run_id]:
                await self._deliver(event)

    def _target(self, content: dict[str, Any]) -> Run | None:
        """A steering message on a thread socket names its run, which must be of this thread."""
        run_id = content.get("run_id")
        if not is_id(run_id):
            return None
        return Run.objects.filter(pk=run_id, thread=self.thread).first()

    def _covers(self, run: Run) -> bool:
        return run.thread == self.thread
