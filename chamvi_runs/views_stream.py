"""``GET chamvi/api/runs/<id>/stream/``: the run's events as Server-Sent Events.

The same events as the websocket, read from the replay buffer (so any web replica can serve any
run, whichever process executes it), then followed until ``run.end``. ``?after=<seq>`` or the
``Last-Event-ID`` header resumes after a seq. A run whose buffer has expired is served from its
stored steps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from .core.states import TERMINAL
from .models import Run
from .replay import replay_after
from .views_api import ApiError, _run_for, api_view

POLL_SECONDS = 0.1
KEEPALIVE_SECONDS = 15.0
SETTLE_GRACE_SECONDS = 2.0


@api_view("GET")
def run_stream(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _run_for(request, run_id)
    raw = request.GET.get("after") or request.headers.get("Last-Event-ID") or "0"
    if not raw.isdigit():
        raise ApiError(400, "invalid_field", "'after' must be a non-negative integer")
    response = StreamingHttpResponse(_events(run.pk, int(raw)), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _frame(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"


def _read(run_id: str, after: int) -> tuple[list[dict[str, Any]], bool]:
    """Events after ``after``, and whether the run had settled before they were read."""
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    return replay_after(run_id, after), status in TERMINAL or status is None


async def _events(run_id: str, after: int) -> AsyncIterator[str]:
    last = after
    quiet_since = time.monotonic()
    while True:
        events, settled = await sync_to_async(_read)(run_id, last)
        for event in events:
            last = event["seq"]
            yield _frame(event)
            if event["type"] == "run.end":
                return
        if events:
            quiet_since = time.monotonic()
        elif settled and time.monotonic() - quiet_since > SETTLE_GRACE_SECONDS:
            # The settling process publishes run.end just after its commit; past this grace the
            # buffer has none (it expired, or the run settled elsewhere, e.g. a cancel).
            return
        elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
        await asyncio.sleep(POLL_SECONDS)
