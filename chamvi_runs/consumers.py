"""Websocket consumers (SPEC §8): one run, or every run of a thread. Authorization in connect();
events replay from the buffer after ``?after=<seq>``, then arrive live from the run's group."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import api
from .broadcast import event_log, run_group, thread_group
from .errors import ChamviError
from .models import Run
from .policy import policy

FORBIDDEN = 4403


class RunConsumer(AsyncJsonWebsocketConsumer):
    groups: list[str] = []

    async def connect(self) -> None:
        await self.accept()
        self.run_id: str = self.scope["url_route"]["kwargs"]["run_id"]
        self.last_seq: dict[str, int] = {}
        allowed = await sync_to_async(self._allowed)()
        if not allowed:
            await self.close(code=FORBIDDEN)
            return
        after = _after(self.scope)
        # Join first, then replay: an event published in between arrives twice and is dropped by seq.
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        self.groups = [run_group(self.run_id)]
        for event in await sync_to_async(event_log().after)(self.run_id, after):
            await self._send_event(event)

    def _allowed(self) -> bool:
        run = Run.objects.filter(pk=self.run_id).first()
        return run is not None and policy().can_view(self.scope["user"], run)

    async def _send_event(self, event: dict[str, Any]) -> None:
        run_id = event.get("run_id", "")
        if event["seq"] <= self.last_seq.get(run_id, 0):
            return
        self.last_seq[run_id] = event["seq"]
        await self.send_json(event)

    async def chamvi_event(self, message: dict[str, Any]) -> None:
        await self._send_event(message["event"])

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json(
                {"type": "error", "code": "invalid_message", "message": "send a JSON object"}
            )
            return
        try:
            reply = await sync_to_async(self._command)(content)
        except ChamviError as exc:
            reply = {"type": "error", "code": getattr(exc, "code", "refused"), "message": str(exc)}
        if reply:
            await self.send_json(reply)

    def _command(self, content: dict[str, Any]) -> dict[str, Any] | None:
        user = self.scope["user"]
        kind = content.get("type")
        run_id = content.get("run_id", getattr(self, "run_id", None))
        run = Run.objects.filter(pk=run_id).first() if run_id else None
        if run is None or not policy().can_view(user, run):
            return {"type": "error", "code": "not_found", "message": "no such run"}
        if kind in ("input", "cancel"):
            if not policy().can_steer(user, run):
                return {"type": "error", "code": "forbidden", "message": "you may not steer this run"}
            if kind == "cancel":
                return {"type": "ack", "action": "cancel", "status": api.cancel_run(run.pk)}
            item = api.send_input(run.pk, content.get("payload"))
            return {"type": "ack", "action": "input", "input_id": item.pk}
        if kind in ("approve", "deny"):
            if not policy().can_decide(user, run):
                return {"type": "error", "code": "forbidden", "message": "you may not decide this approval"}
            decide = api.approve if kind == "approve" else api.deny
            reason = content.get("reason") or ""
            waitpoint = decide(str(content.get("approval_id", "")), by=user, reason=str(reason))
            return {"type": "ack", "action": kind, "approval_id": waitpoint.approval_id}
        return {"type": "error", "code": "invalid_message", "message": f"unknown type {kind!r}"}


class ThreadConsumer(RunConsumer):
    async def connect(self) -> None:
        await self.accept()
        self.thread: str = self.scope["url_route"]["kwargs"]["thread"]
        self.last_seq = {}
        run_ids = await sync_to_async(self._visible_runs)()
        if run_ids is None:
            await self.close(code=FORBIDDEN)
            return
        await self.channel_layer.group_add(thread_group(self.thread), self.channel_name)
        self.groups = [thread_group(self.thread)]
        after = _after(self.scope)
        for run_id in run_ids:
            for event in await sync_to_async(event_log().after)(run_id, after):
                await self._send_event(event)

    def _visible_runs(self) -> list[str] | None:
        runs = list(Run.objects.filter(thread=self.thread).order_by("created_at"))
        user = self.scope["user"]
        if not runs or not all(policy().can_view(user, r) for r in runs):
            return None
        return [r.pk for r in runs]


def _after(scope: dict[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode()).get("after", ["0"])
    try:
        return max(0, int(values[0]))
    except ValueError:
        return 0
