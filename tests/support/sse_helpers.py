"""Reading ``GET chamvi/api/runs/<id>/stream/`` from the Django test client, all at once or event by
event (for a run that is still going)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import async_to_sync


def parse(body: bytes | str) -> list[dict[str, Any]]:
    """The events of an SSE body; each frame's event name must match its JSON, and its id too (a
    child run's frames, on its parent's stream, have none: the id is the parent's seq)."""
    text = body.decode() if isinstance(body, bytes) else body
    frames = [f for f in text.split("\n\n") if f.strip() and not f.startswith(":")]
    out = []
    for frame in frames:
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        event = json.loads(fields["data"])
        assert fields["event"] == event["type"]
        assert fields.get("id") == (None if "parent_run_id" in event else str(event["seq"]))
        out.append(event)
    return out


def body(response: Any) -> bytes:
    """The whole body of a stream that ends by itself (a settled run)."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


class Stream:
    """An open stream, read event by event inside an async test scenario."""

    def __init__(self, response: Any) -> None:
        assert response.status_code == 200, response.content
        self.chunks = response.streaming_content.__aiter__()
        self.pending = ""

    async def next(self, timeout: float = 10) -> dict[str, Any] | None:
        """The next event; None when the stream ended."""
        while True:
            while "\n\n" in self.pending:
                frame, self.pending = self.pending.split("\n\n", 1)
                events = parse(frame + "\n\n")
                if events:
                    return events[0]
            try:
                chunk = await asyncio.wait_for(self.chunks.__anext__(), timeout)
            except StopAsyncIteration:
                return None
            self.pending += chunk.decode()

    async def until(self, kind: str, timeout: float = 10) -> list[dict[str, Any]]:
        """Every event up to and including the first of type ``kind``."""
        got: list[dict[str, Any]] = []
        while not got or got[-1]["type"] != kind:
            event = await self.next(timeout)
            assert event is not None, f"the stream ended before {kind}: {got}"
            got.append(event)
        return got

    async def close(self) -> None:
        await self.chunks.aclose()
