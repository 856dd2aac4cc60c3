"""The only writer of run state. Every conditional write lives in this package and says whether it
applied: ``True``/``False`` (the docstring says what False means), or the row written / ``None``.
A write raises only for a caller's mistake it must show (an unknown id, a decided approval, a bad
token, an input over its run's caps: ``RunNotFound``, ``DecisionRefused``, ``InputRefused``), never
to say that a fence refused it.

Rules of ownership, on one screen:

- A status changes only along ``core.states.TRANSITIONS``: every update filters on the sources of
  its target status (``fence.to``), so a write that arrives late matches no row.
- An execution holds a claim (owner, attempt). ``attempt`` is a fencing token that grows with every
  claim; every write of an execution filters on status ``running``, owner and attempt
  (``fence.held``), so a worker that froze past its lease and woke up writes nothing (False).
- A requested cancel wins over every write that keeps a run going (open a wait, back to waiting,
  interrupted): those are refused in the same statement, and the execution settles ``cancelled``.
- Lease expiry is computed by the database clock, never the worker's.
- Steps, checkpoint and usage of one model call are written in one transaction, whose first
  statement is the fenced update of the run row: that row lock also orders it against claims.
- Lock order: a Thread row, then the run row, then its wait point. A run is inserted in a thread
  only with the Thread row locked (``thread_for``), and the prune deletes a thread, or the runs
  holding its history, only with that row locked (SKIP LOCKED, so it never waits, whatever it
  holds): a run being started never loses its thread.
- A child run is inserted with the wait step that starts it (at most one per call, a constraint);
  its settle, once committed, decides its parent's wait for it (``children.settle_into_parent``).
- An effect tool's transaction holds the run's effect lock (``fence.effect_lock``, advisory), never
  its row, while the tool runs, and renews the lease, fenced, just before its commit. Claims and
  cancels only try that lock, and the lease keeper never touches it nor waits on a row
  (``renew_many``): on PostgreSQL no one waits for an effect tool.
- A claim takes only a run of a version its process has (``core.records.lacks_version``), and a
  run moves to another version only while no live claim holds it (``versions.move_version``): no
  execution ever runs on code its run was not written for.

Modules: ``claims`` (claim, renew, count a model call), ``progress`` (steps, waits, settles),
``steering`` (cancel, input, decisions), ``children`` (child runs), ``creating``, ``notifying``,
``effects``, ``versions`` (the agent versions of the processes that execute runs), ``pruning``
(retention: ``manage.py chamvi_prune``, with ``references``: the artifacts runs still use);
``queries`` holds the read-only selections and ``fence`` the SQL pieces the writes share. This
module is the face the runtime talks to: it satisfies ``core.ports.Store``.
"""

from __future__ import annotations

from ..core.records import CallRef, Claim, StepRecord, arguments_hash, hash_token
from .children import (
    active_children,
    ancestors,
    descendants,
    is_below,
    orphans,
    settle_into_parent,
    settled_unannounced,
)
from .claims import claim, count_model_call, renew, renew_many, start_model_call
from .connections import hand_back
from .creating import create_run, thread_for
from .effects import effect_record, lock_for_effect, record_effect
from .histories import history
from .notifying import (
    NOTIFY_LEASE,
    mark_notified,
    notification_failed,
    notify_backoff,
    reissue_token,
    take_notification,
)
from .progress import (
    CLOSED_AT_END,
    back_to_waiting,
    open_wait,
    record_listings,
    save_and_settle,
    save_step,
    save_step_and_count,
    settle,
)
from .pruning import PruneRefused, PruneReport, Retention, prune
from .queries import (
    cancels_among,
    checkpoint,
    decided_calls,
    last_model_step,
    pending_inputs,
    resumed_decision,
    run,
    thread_nodes,
    waiting_at,
)
from .steering import add_input, cancel, decide, fail_expired_wait
from .versions import (
    beat,
    called_tools,
    first_seen,
    forget_workers,
    is_live,
    live_versions,
    move_version,
    ready_runs_of,
    stop_worker,
    was_seen,
)

__all__ = [
    "CLOSED_AT_END",
    "NOTIFY_LEASE",
    "CallRef",
    "Claim",
    "PruneRefused",
    "PruneReport",
    "Retention",
    "StepRecord",
    "active_children",
    "add_input",
    "ancestors",
    "arguments_hash",
    "back_to_waiting",
    "beat",
    "called_tools",
    "cancel",
    "cancels_among",
    "checkpoint",
    "claim",
    "count_model_call",
    "create_run",
    "decide",
    "decided_calls",
    "descendants",
    "effect_record",
    "fail_expired_wait",
    "first_seen",
    "forget_workers",
    "hand_back",
    "hash_token",
    "history",
    "is_below",
    "is_live",
    "last_model_step",
    "live_versions",
    "lock_for_effect",
    "mark_notified",
    "move_version",
    "notification_failed",
    "notify_backoff",
    "open_wait",
    "orphans",
    "pending_inputs",
    "prune",
    "ready_runs_of",
    "record_effect",
    "record_listings",
    "reissue_token",
    "renew",
    "renew_many",
    "resumed_decision",
    "run",
    "save_and_settle",
    "save_step",
    "save_step_and_count",
    "settle",
    "settle_into_parent",
    "settled_unannounced",
    "start_model_call",
    "stop_worker",
    "take_notification",
    "thread_for",
    "thread_nodes",
    "waiting_at",
    "was_seen",
]
