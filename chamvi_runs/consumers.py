"""Websocket consumers (SPEC §8): one run, or every run of a thread.

Authorization happens in ``connect()``: a user the policy does not let view the run is accepted and
closed at once with 4403, before any group is joined. Events replay from the buffer after
``?after=<seq>`` (a settled run whose buffer expired is replayed from its stored steps), then arrive
live from the group; a per-run ``seq`` drops what was already sent. Client messages (``input``,
``cancel``, ``approve``, ``deny``) are checked against the same policy as the HTTP API and answered
with an ``ack`` or an ``error``; a malformed message is an error reply, never a disconnect.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth.models import AnonymousUser

from . import api
from .broadcast import run_group, thread_group
from .errors import ChamviError, InvalidPayload, RunNotFound
from .models import Run, WaitPoint
from .policy import policy
from .replay import replay_after

FORBIDDEN = 4403
COMMANDS = ("input", "cancel", "approve", "deny")


def _error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


class RunConsumer(AsyncJsonWebsocketConsumer):
    """``ws/chamvi/runs/<run_id>/``: the events of one run."""

    async def connect(self) -> None:
        await self.accept()
        self.allowed = False
        self.last_seq: dict[str, int] = {}
        self.run_id: str = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(self._can_view)(self.run_id):
            await self.close(code=FORBIDDEN)
            return
        after = _after(self.scope)
        # Nothing at or before ``after`` is sent, not even live, should the run not have reached it.
        self.last_seq[self.run_id] = after
        # Join first, then replay: an event published in between arrives twice and is dropped by seq.
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        self.groups = [run_group(self.run_id)]
        self.allowed = True
        for event in await database_sync_to_async(replay_after)(self.run_id, after):
            await self._send_event(event)

    @property
    def user(self) -> Any:
        return self.scope.get("user") or AnonymousUser()

    def _can_view(self, run_id: str) -> bool:
        run = Run.objects.filter(pk=run_id).first()
        return run is not None and bool(policy().can_view(self.user, run))

    async def _send_event(self, event: dict[str, Any]) -> None:
        run_id = event.get("run_id", "")
        seq = event.get("seq")
        if not isinstance(seq, int) or seq <= self.last_seq.get(run_id, 0):
            return
        self.last_seq[run_id] = seq
        await self.send_json(event)

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        await self._send_event(message["event"])

    # --- client -> server ---------------------------------------------------------------------

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if not getattr(self, "allowed", False):
            return
        if text_data is None:
            await self.send_json(_error("invalid_message", "send JSON in text frames"))
            return
        try:
            content = await self.decode_json(text_data)
        except ValueError:
            await self.send_json(_error("invalid_message", "the message is not JSON"))
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json(_error("invalid_message", "send a JSON object"))
            return
        try:
            reply = await database_sync_to_async(self._command)(content)
        except ChamviError as exc:
            reply = _error(_code(exc), str(exc))
        await self.send_json(reply)

    def _command(self, content: dict[str, Any]) -> dict[str, Any]:
        user, kind = self.user, content.get("type")
        if kind not in COMMANDS:
            return _error("invalid_message", f"unknown type {kind!r}; one of {', '.join(COMMANDS)}")
        if kind in ("approve", "deny"):
            approval_id = content.get("approval_id")
            if not isinstance(approval_id, str) or not approval_id:
                return _error("invalid_message", f"{kind} needs an approval_id")
            waitpoint = WaitPoint.objects.filter(approval_id=approval_id).select_related("run").first()
            # The decision is checked against the run the approval belongs to, which must be one of
            # this socket's runs.
            run = waitpoint.run if waitpoint is not None else None
            if run is None or not self._covers(run) or not policy().can_view(user, run):
                return _error("not_found", f"no approval {approval_id}")
            if not policy().can_decide(user, run):
                return _error("forbidden", "you may not decide this approval")
            reason = content.get("reason") or ""
            decide = api.approve if kind == "approve" else api.deny
            waitpoint = decide(approval_id, by=user, reason=str(reason))
            return {"type": "ack", "action": kind, "approval_id": waitpoint.approval_id}
        run = self._target(content)
        if run is None or not policy().can_view(user, run):
            return _error("not_found", "no such run")
        if not policy().can_steer(user, run):
            return _error("forbidden", "you may not steer this run")
        if kind == "cancel":
            return {"type": "ack", "action": "cancel", "status": api.cancel_run(run.pk)}
        item = api.send_input(run.pk, content.get("payload"))
        return {"type": "ack", "action": "input", "input_id": item.pk}

    def _target(self, content: dict[str, Any]) -> Run | None:
        """The run a steering message is for: this socket's run (naming another one is refused)."""
        if content.get("run_id", self.run_id) != self.run_id:
            return None
        return Run.objects.filter(pk=self.run_id).first()

    def _covers(self, run: Run) -> bool:
        return run.pk == self.run_id


class ThreadConsumer(RunConsumer):
    """``ws/chamvi/threads/<thread>/``: the events of every run of a thread the user may view.

    The user must be able to view at least one run of the thread. Runs they may not view (a thread
    is only a name: anyone may start a run in it) are neither replayed nor forwarded live."""

    async def connect(self) -> None:
        await self.accept()
        self.allowed = False
        self.last_seq = {}
        self.thread: str = self.scope["url_route"]["kwargs"]["thread"]
        self.visible: dict[str, bool] = await database_sync_to_async(self._visibility)()
        if not any(self.visible.values()):
            await self.close(code=FORBIDDEN)
            return
        after = _after(self.scope)
        await self.channel_layer.group_add(thread_group(self.thread), self.channel_name)
        self.groups = [thread_group(self.thread)]
        self.allowed = True
        for run_id, visible in self.visible.items():
            if visible:
                self.last_seq[run_id] = after
                for event in await database_sync_to_async(replay_after)(run_id, after):
                    await self._send_event(event)

    def _visibility(self) -> dict[str, bool]:
        runs = Run.objects.filter(thread=self.thread).order_by("created_at", "id")
        return {run.pk: bool(policy().can_view(self.user, run)) for run in runs}

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        run_id = event.get("run_id", "")
        if run_id not in self.visible:
            # A run started in the thread after this socket connected.
            self.visible[run_id] = await database_sync_to_async(self._can_view)(run_id)
        if self.visible[run_id]:
            await self._send_event(event)

    def _target(self, content: dict[str, Any]) -> Run | None:
        """A steering message on a thread socket names its run, which must be of this thread."""
        run_id = content.get("run_id")
        if not isinstance(run_id, str):
            return None
        return Run.objects.filter(pk=run_id, thread=self.thread).first()

    def _covers(self, run: Run) -> bool:
        return run.thread == self.thread


def _code(exc: ChamviError) -> str:
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code
    if isinstance(exc, RunNotFound):
        return "not_found"
    if isinstance(exc, InvalidPayload):
        return "payload_too_large" if exc.too_large else "invalid_payload"
    return "refused"


def _after(scope: dict[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("after", ["0"])
    try:
        return max(0, int(values[0]))
    except ValueError:
        return 0
