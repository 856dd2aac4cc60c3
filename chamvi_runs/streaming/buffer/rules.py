"""The buffer's rules, the same for both stores: caps, lifetime, what a region covers and carries.
The Lua scripts of the Redis store apply them too (``lua/``); a change here is a change there. The
scripts spell the event types they test themselves (``run.start``, ``run.waiting``, ``run.end``,
``replay.truncated``): here they are ``events``' names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.utils import timezone

from ...conf import conf
from ..events import REPLAY_TRUNCATED, RUN_END, RUN_START, RUN_WAITING

# Events kept per run: a model streaming a 4-character delta every 20 ms fills it in 200 s.
BUFFER_EVENTS = 10_000
# Bytes of events' JSON kept per run. A delta event is about 150 bytes, so a model's 10,000 events
# are 1.5 to 2 MB and never reach it; it holds 8 times the steering inputs one model call may take
# (MAX_PENDING_INPUT_BYTES, 1 MiB by default). What it bounds: events that carry what callers and
# tools send (steering inputs of up to MAX_PAYLOAD_BYTES each, tool outputs), kept in Redis for as
# long as a run may wait: by the event cap alone one run could hold 10,000 inputs of 256 KiB (43 MB
# in 3 s was measured).
BUFFER_BYTES = 8 * 1024 * 1024
SEQ_TTL = 90 * 24 * 3600
# The event that opens a rebuild (``events.replay_truncated``).
MARKER = REPLAY_TRUNCATED
# Above any run's seq: a client's seq is clamped to it before a script sees it (Lua prints numbers
# with 14 digits, so the scripts must never count near 10**14). A larger seq is just ahead.
MAX_SEQ = 10**12


def buffer_ttl(event: dict[str, Any]) -> int:
    """Seconds a run's buffer lives after ``event``: long enough for any wait of an active run,
    ``STREAM_BUFFER_SECONDS`` once it has ended."""
    settled = max(math.ceil(conf.STREAM_BUFFER_SECONDS), 1)
    if event.get("type") == RUN_END:
        return settled
    ttl = settled + math.ceil(conf.APPROVAL_TTL.total_seconds())
    expires = event.get("expires_at") if event.get("type") == RUN_WAITING else None
    if isinstance(expires, str):
        # An agent's own approval TTL may be longer than the site's.
        try:
            left = (datetime.fromisoformat(expires) - timezone.now()).total_seconds()
        except (TypeError, ValueError):
            return ttl
        ttl = max(ttl, settled + math.ceil(left))
    return ttl


def cover(event: dict[str, Any]) -> tuple[int, str]:
    """What of ``event`` a region may already hold: its step (-1: none) and, for the step-less events
    a rebuild carries, a token (``start`` for run.start, ``w:<approval_id>`` for run.waiting)."""
    step = event.get("step")
    kind = event.get("type")
    token = ""
    if kind == RUN_START:
        token = "start"
    elif kind == RUN_WAITING:
        token = f"w:{event.get('approval_id')}"
    return (step if isinstance(step, int) and not isinstance(step, bool) else -1), token


def waiting_tokens(approval_ids: list[str]) -> str:
    """The cover tokens of a rebuild's open ``run.waiting`` events, as one string (Lua reads it):
    each surrounded by spaces (questions of one model call wait together)."""
    return "".join(f" w:{a}" for a in approval_ids) + " " if approval_ids else ""


def holds_waiting(waiting: str, token: str) -> bool:
    """Whether a region's ``waiting`` tokens hold ``token`` (a region stored by the previous
    release holds one token, unspaced)."""
    return bool(token) and (token == waiting or f" {token} " in waiting)


class Window(NamedTuple):
    """What the buffer holds after a seq: ``top`` is the run's highest seq so far (0: none), and
    ``events`` the held events after the seq, or None when some of them are gone (and no region
    covers them)."""

    top: int
    events: list[dict[str, Any]] | None


@dataclass(frozen=True)
class Rebuild:
    """A run rebuilt from its stored steps, to be stored as a region (``replay.rebuild`` makes it)."""

    marker: dict[str, Any]  # the replay.truncated event that opens a region after lost seqs
    events: list[dict[str, Any]]  # run.start, the stored steps, the open run.waiting (no seq)
    step: int  # the highest stored step index the events cover (-1: none)
    waiting: str  # cover tokens of the run.waiting events they hold (``waiting_tokens``)
    truncated: bool  # earlier steps were left out: the marker opens the region even at seq 0
    ttl: int


def carried(held: list[dict[str, Any]], step: int, waiting: str) -> list[dict[str, Any]]:
    """The held events a region over stored steps up to ``step`` must carry after them: the later
    steps' events (the step in flight), and the step-less ones that came after the covered steps'
    last event (run.resume, a newer run.waiting, run.end). Lua's REBASE applies the same rule."""
    cut = max((e["seq"] for e in held if 0 <= cover(e)[0] <= step), default=0)
    out = []
    for event in held:
        index, token = cover(event)
        if event.get("type") in (RUN_START, MARKER):
            continue
        if index >= 0:
            if index > step:
                out.append(event)
        elif event["seq"] > cut and not holds_waiting(waiting, token):
            out.append(event)
    return out


def region(rebuild: Rebuild, held: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The events of a new region after seq ``top``: the marker (when seqs before it were lost or
    steps left out), the rebuilt events, then what ``held`` carries past them."""
    lead = [rebuild.marker] if top > 0 or rebuild.truncated else []
    body = [*lead, *rebuild.events, *carried(held, rebuild.step, rebuild.waiting)]
    return [{**event, "seq": seq} for seq, event in enumerate(body, start=top + 1)]


def dropped(event: dict[str, Any], covers: tuple[int, int, str] | None) -> bool:
    """Whether a region (first seq, step, waiting token) already holds ``event``: the memory store's
    test, which APPEND's Lua makes in Redis."""
    if covers is None:
        return False
    index, token = cover(event)
    return 0 <= index <= covers[1] or token == "start" or holds_waiting(covers[2], token)
