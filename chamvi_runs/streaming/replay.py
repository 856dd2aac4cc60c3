"""What a client gets when it asks for a run's events after a seq (SPEC §8), websocket and SSE alike.

1. The buffer (``buffer/``) holds every event after the seq: exactly those, in seq order, once.
2. It does not (the buffer expired, the cap trimmed it, Redis lost it): the run is rebuilt from its
   stored steps: ``run.start``, each step (the steering ``input`` its model call took, its text as
   one ``delta`` per kind, its tool calls and results, the ``run.resume`` of a decision after a
   wait step), its open ``run.waiting``, its ``run.end``. The rebuild is numbered after the run's
   highest seq N and opened by a ``replay.truncated`` event at N+1, which tells the client that the
   events before it are gone and to drop what it rendered of the run: what follows rebuilds it. So
   a client's seqs only grow (but at a restart, 3.), and every seq it was sent is a valid place to
   resume from.

   - Active run: the rebuild is stored in the buffer as a region, atomically after the counter,
     followed by the buffered events of what is not stored yet (the step in flight, a later
     ``run.waiting``); the counter moves past the region, so the run's next live event has the
     next seq: no gap and no duplicate for anyone. Every later client behind the buffer is served
     from that region. A client that was up to date sees live seqs jump past the region and, like
     any client that sees a gap, reads the buffer after its last seq: it gets the marker and the
     region too.
   - Settled run: nothing follows, nothing is stored: the same rebuild is computed each time and
     numbered after N, so a client that resumes inside it goes on where it stopped. A stream that
     sent another event at its seq than the rebuild holds there gets a restart (3.).
   - No seq known at all (the counter's 90 days are over, or Redis lost its data): the rebuild is
     numbered from 1 with no marker, as the run's first events.
3. A client *ahead* of the server, whose seq the server never sent or no longer knows (Redis, or
   embedded mode's process, lost the run's seqs after sending them; or a client made one up), gets
   a *restart*: a ``replay.truncated`` at or below its seq, then the run from its start, and it
   takes them, whatever its seq (``restarts``; a client must drop what it showed and go on from
   the marker's seq). A seq never numbers anything: a client cannot move a run's counter, so it
   cannot push the run's seqs past what every other client will ever ask for.

   - Active run, ahead once its seq is above the run's highest seq: what the buffer holds from the
     run's start (its first events, or the latest region), else the rebuild stored as a region
     after the counter (or the region already held: many clients ahead cost one region).
   - Settled run, ahead once its seq is past the end of the rebuild numbered after N (none known:
     any seq): that rebuild.
   - What a restart sends does not begin with a marker (the run's first events, a rebuild
     numbered from 1): one is put before it, stored nowhere, with the first event's seq minus 1
     (0 when that is 1).
4. A rebuild carries the latest ``REBUILD_STEPS`` steps at most, and no more steps than fit in
   ``REBUILD_BYTES`` (the latest model call and what follows it at least); then its marker's
   ``from_step`` says where it starts (earlier steps are in the run's JSON).

Where this bends "every event after that seq exactly once": a client behind the buffer gets the
marker and the rebuild instead of the lost events (deltas are not stored: a step's text comes as
one delta); of a step in flight longer than the caps, only the events still held are carried; a
client ahead of the server starts over at a seq at or below its own.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from ..core.states import TERMINAL, Status
from ..models import Run, Step, WaitPoint
from ..store import queries
from ..store.fence import db_now_plus
from .buffer import (
    BUFFER_BYTES,
    BUFFER_EVENTS,
    MARKER,
    MemoryEventLog,
    Rebuild,
    RedisEventLog,
    Window,
    buffer_ttl,
    event_log,
    region,
    waiting_tokens,
)
from .events import (
    RUN_START,
    Event,
    delta,
    input_taken,
    replay_truncated,
    run_resume,
    run_start,
    run_waiting,
    step_end,
    step_start,
    tool_call,
    tool_result,
)
from .serializers import decision_json, lineage, parent_call, run_end_event, waiting_event

# How long after its settle a run's own run.end may still be on its way (the settling process's
# events writer may be behind, waiting for the channel layer) before a stream stores it instead.
END_GRACE_SECONDS = 30.0
# A step is at most 4 events in a rebuild (start, two deltas, end): a region stays well within the
# caps, so the events after it are kept too.
REBUILD_STEPS = BUFFER_EVENTS // 20
REBUILD_BYTES = BUFFER_BYTES // 4


def replay_after(run_id: str, after: int) -> list[dict[str, Any]]:
    """Every event of the run with a seq above ``after``, in seq order, each once; or a restart for
    a client ahead of the server (the rules above). Reads the database only when the buffer cannot
    answer."""
    return replay_for(run_id, after)[0]


def replay_for(run_id: str, after: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``replay_after``, and the buffer's event at ``after`` when it holds it: what a stream that
    goes on from there compares with later, to tell that the run's seqs were numbered anew
    (``missed_after``)."""
    log = event_log()
    window, own = _window_from(log, run_id, after)
    return _replayed(log, run_id, after, window), own


def _window_from(
    log: MemoryEventLog | RedisEventLog, run_id: str, after: int
) -> tuple[Window, dict[str, Any] | None]:
    """The buffer's window after ``after``, and its event at ``after`` (None: not held), in one read
    but when that event is gone and the buffer holds the rest."""
    if after > 0:
        wider = log.window(run_id, after - 1)
        if wider.events is not None:
            own = wider.events[0] if wider.events and wider.events[0]["seq"] == after else None
            return Window(wider.top, [e for e in wider.events if e["seq"] > after]), own
    return log.window(run_id, after), None


def _replayed(
    log: MemoryEventLog | RedisEventLog,
    run_id: str,
    after: int,
    window: Window,
    sent: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The replay after ``after`` when the buffer's window cannot answer alone. ``sent``, the event
    a stream sent at ``after`` (``missed_after``), tells a seq the rebuild of a settled run numbers
    from one the run's lost seqs numbered."""
    up_to_date = window.top > 0 and after <= window.top
    if window.events is not None and (window.events or up_to_date):
        return window.events
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return window.events or []
    if run.status in TERMINAL:
        built = rebuild(run)
        events = region(built, [], window.top)
        if after <= (events[-1]["seq"] if window.top else 0) and not _numbers_another(events, after, sent):
            return [e for e in events if e["seq"] > after]
        # Sent seqs that neither the counter nor the rebuild after it numbered, or that the rebuild
        # numbers with another event than the stream sent there: the run's seqs were lost and
        # numbered again below the stream's (its new events may still be on their way to the buffer
        # when the run has settled).
        return _restart(events, built.marker, window.top)
    if after > window.top:
        return _restart_active(log, run)
    if window.events is None or (window.top == 0 and run.started_at is not None):
        # Behind the buffer, or the run has run while no seq is known: store the rebuild.
        return [e for e in log.rebase(run_id, rebuild(run), after) if e["seq"] > after]
    return []


def _restart_active(log: MemoryEventLog | RedisEventLog, run: Run) -> list[dict[str, Any]]:
    whole = log.window(run.pk, 0)
    marker = replay_truncated(run_id=run.pk, status=run.status, from_step=0)
    if run.started_at is None:
        # Nothing to rebuild (and a region's run.start would claim it runs): what it has, if any.
        return _restart(whole.events or [], marker, whole.top)
    if whole.events and whole.events[0]["type"] in (RUN_START, MARKER):
        # Held from the run's start or from a region's: the run, whole, with nothing to store.
        return _restart(whole.events, marker, whole.top)
    return _restart(log.rebase(run.pk, rebuild(run), None), marker, whole.top)


def _numbers_another(events: list[dict[str, Any]], after: int, sent: dict[str, Any] | None) -> bool:
    """Whether ``events`` (a rebuild's region) hold another event at ``after`` than ``sent``, the
    event a stream sent at that seq (None: not known, as for a client that reconnects)."""
    if sent is None:
        return False
    there = next((event for event in events if event["seq"] == after), None)
    return there is not None and renumbered(there, sent)


def _restart(events: list[dict[str, Any]], marker: dict[str, Any], top: int) -> list[dict[str, Any]]:
    """``events`` (the run from its start) opened by a marker: theirs, or one stored nowhere."""
    if events and events[0]["type"] == MARKER:
        return events
    first = events[0]["seq"] if events else top + 1
    return [{**marker, "seq": first - 1}, *events]


def restarts(events: list[dict[str, Any]], after: int) -> bool:
    """Whether ``events``, a replay for a client at ``after``, is a restart: it opens with a marker
    at or below that seq. The client, and a stream sending for it, go on from the marker's seq."""
    return bool(events) and events[0].get("type") == MARKER and events[0]["seq"] <= after


def missed_after(run_id: str, after: int, sent: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The events after ``after`` for a stream repairing what the layer lost: from the buffer alone
    (none yet is an answer too), and rebuilt from the stored steps only when some are gone or the
    counter no longer knows the stream's seq (then possibly a restart).

    ``sent`` is the event the stream sent at ``after``. When the buffer holds another one there,
    the run's seqs were lost and numbered again past the stream's (Redis lost its data, or evicted
    the run's keys, and the run went on): what follows it in the buffer is not what follows the
    stream's, and the stream gets a restart (``restart``). So it does when the buffer's seqs are
    still below the stream's and the run has settled (its new events on their way to the buffer)
    and the rebuild numbered after them holds another event at the stream's seq."""
    log = event_log()
    if sent is None:
        window = log.window(run_id, after)
    else:
        window, own = _window_from(log, run_id, after)
        if own is not None and renumbered(own, sent):
            return restart(run_id)
    if window.events is None or window.top < after:
        return _replayed(log, run_id, after, window, sent)
    return window.events


def renumbered(held: dict[str, Any], sent: dict[str, Any]) -> bool:
    """Whether ``held``, the buffer's event at the seq a stream sent ``sent`` at, shows that the
    run's seqs were numbered again since: another event there. A marker stored nowhere (a restart's
    own) is not in the buffer to compare with."""
    return sent.get("type") != MARKER and held != sent


def restart(run_id: str) -> list[dict[str, Any]]:
    """The run from its start, opened by a marker, for a stream whose seqs the run's no longer
    number (``renumbered``): what a client ahead of the server gets, whatever the counter is."""
    log = event_log()
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return []
    top = log.window(run_id, 0).top
    if run.status in TERMINAL:
        built = rebuild(run)
        return _restart(region(built, [], top), built.marker, top)
    return _restart_active(log, run)


def end_lost(run_ids: Collection[str]) -> set[str]:
    """Give each of these runs that has been settled ``END_GRACE_SECONDS`` a ``run.end`` in the
    buffer if the buffer has none: the settling process died, or Redis refused the batch, between
    its commit and the append. ``EventLog.end`` appends it once, whoever asks, with the run's next
    seq; a stream then reads it like any event the layer did not deliver. Returns those runs: their
    buffer holds every event they will ever have (or nothing, and a replay rebuilds them)."""
    # By the database's clock, which stamped finished_at (at the start of the settling transaction).
    settled_before = db_now_plus(timedelta(seconds=-END_GRACE_SECONDS))
    runs = Run.objects.filter(pk__in=list(run_ids), status__in=TERMINAL, finished_at__lte=settled_before)
    settled = list(runs.values_list("pk", flat=True))
    log = event_log()
    for run in Run.objects.filter(pk__in=log.lacking_end(settled)):
        log.end(run.pk, {**run_end_event(run), "run_id": run.pk})
    return set(settled)


def settled_after(run_id: str, after: int, sent: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``missed_after`` for a stream whose run has settled: its ``run.end`` included (``end_lost``)
    once it has been settled ``END_GRACE_SECONDS``."""
    end_lost([run_id])
    return missed_after(run_id, after, sent)


def events_from_steps(run: Run) -> list[dict[str, Any]]:
    """The run rebuilt from its stored steps, numbered from 1."""
    return region(rebuild(run), [], 0)


def rebuild(run: Run) -> Rebuild:
    steps = list(run.steps.order_by("-index")[: REBUILD_STEPS + 1])[::-1]
    truncated = len(steps) > REBUILD_STEPS
    if truncated:
        # A tool step takes its call id from the model call before it: start at a model call.
        first = next((n for n, s in enumerate(steps) if n > 0 and s.kind == "llm"), len(steps))
        steps = steps[first:]
    inputs, decisions = queries.taken_inputs(run, steps), _decisions(run, steps)
    stepped = _step_events(steps, inputs, decisions)
    first = _first_fitting(steps, stepped)
    if first:
        truncated, steps = True, steps[first:]
        stepped = _step_events(steps, inputs, decisions)
    events: list[Event] = [run_start(**lineage(run), parent=parent_call(run)), *stepped]
    waits = (
        # A child run's wait asks nobody: viewers follow the child (``children`` of the run's JSON).
        list(
            run.waitpoints.filter(decision__isnull=True)
            .exclude(kind=WaitPoint.Kind.CHILD)
            .order_by("call_position")
        )
        if run.status == Status.WAITING
        else []
    )
    events.extend(run_waiting(**waiting_event(w)) for w in waits)
    if run.finished_at is not None:
        events.append(run_end_event(run))
    # A child run's events name its parent, as its live ones do (``ChannelsBroadcaster``).
    family = {"run_id": run.pk, "parent_run_id": run.parent_id} if run.parent_id else {"run_id": run.pk}
    events = [{**event, **family} for event in events]
    first_step = steps[0].index if steps else 0
    marker = replay_truncated(run_id=run.pk, status=run.status, from_step=first_step)
    return Rebuild(
        marker=marker,
        events=events,
        step=max((s.index for s in steps), default=-1),
        waiting=waiting_tokens([w.approval_id for w in waits]),
        truncated=truncated,
        ttl=max(buffer_ttl(event) for event in events),
    )


def _first_fitting(steps: list[Step], events: list[dict[str, Any]]) -> int:
    """Where the steps whose ``events`` fit in ``REBUILD_BYTES`` begin: the first step, or a model
    call's (a tool step takes its call id from the model call before it); the latest model call's
    when none fits."""
    sizes = dict.fromkeys((s.index for s in steps), 0)
    step = steps[0].index if steps else 0
    for event in events:
        step = event.get("step", step)  # a run.resume goes with the step before it
        sizes[step] += len(json.dumps(event))
    starts = [0, *(n for n, s in enumerate(steps) if n > 0 and s.kind == "llm")]
    left, previous = sum(sizes.values()), 0
    for start in starts:
        left -= sum(sizes[s.index] for s in steps[previous:start])
        previous = start
        if left <= REBUILD_BYTES:
            return start
    return starts[-1]


def _decisions(run: Run, steps: list[Step]) -> dict[int, dict[str, Any]]:
    """Wait step index -> the decision the run resumed after: one with a step stored after it. A
    cancel is told by run.end; an expiry that failed the run never resumed; an active run's latest
    decision is left to its own ``run.resume``, live or carried after the region (a region holds
    each event once). Every decision is in the run's JSON and its ``run.end`` either way."""
    decided = queries.decided_waitpoints(run).exclude(decision=WaitPoint.Decision.CANCELLED)
    last = max((s.index for s in steps), default=-1)
    return {w.step_index: decision_json(w) for w in decided if w.step_index < last}


def _step_events(
    steps: list[Step], inputs: dict[str, Any], decisions: dict[int, dict[str, Any]]
) -> list[Event]:
    """The events of ``steps`` as the executions emitted them, built by the same ``events``
    functions: the inputs each model call took before it, and the ``run.resume`` of a decision
    after the wait step that asked for it."""
    events: list[Event] = []
    # Tool steps do not store their call id; each takes the first unused call of its name from the
    # model call before it, in order, as the engine ran them.
    unused: list[tuple[str, str]] = []
    for step in steps:
        index, attempt, output = step.index, step.attempt, step.output or {}
        if step.kind == "llm":
            for input_id in (step.input or {}).get("inputs") or []:
                if input_id in inputs:
                    events.append(input_taken(step=index, input_id=input_id, payload=inputs[input_id]))
            events.append(step_start(step=index, attempt=attempt))
            for kind in ("reasoning", "text"):
                if output.get(kind):
                    events.append(delta(step=index, attempt=attempt, kind=kind, text=output[kind]))
            events.append(step_end(step=index, attempt=attempt, finish_reason=output.get("finish_reason")))
            unused = [(c["id"], c["function"]["name"]) for c in output.get("tool_calls") or []]
        elif step.kind == "tool":
            call_id = next((cid for cid, name in unused if name == step.name), None)
            if call_id is not None:
                unused.remove((call_id, step.name))
            events.append(tool_call(step=index, tool_call_id=call_id, name=step.name, input=step.input))
            events.append(
                tool_result(
                    step=index, tool_call_id=call_id, name=step.name, output=step.output, error=step.error
                )
            )
        elif step.kind == "wait" and index in decisions:
            events.append(run_resume(decisions[index]))
    return events
