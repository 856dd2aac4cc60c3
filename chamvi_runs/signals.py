"""Signals sent by the engine. Receivers get keyword arguments as documented per signal.

A signal that no receiver listens to costs one check when it is sent: ``chamvi_runs.metrics``
connects its receivers only where prometheus-client is installed."""

from django.dispatch import Signal

run_creating = Signal()
"""A run is about to be created, in the process and context of its caller (an HTTP request's view,
a task): ``agent``, ``carrier`` (a dict a receiver may fill with what every execution of the run
should know of its origin: ``chamvi_runs.tracing`` puts the W3C trace context there). The run stores
the carrier (``Run.trace_context``)."""

run_started = Signal()
"""An execution claimed the run: ``run``, ``resumed`` (bool), ``attempt``, ``decision`` (the
``WaitPoint`` whose decision or expiry the execution resumes after, or None)."""

run_delta = Signal()
"""A streamed text or reasoning fragment, local to the executing process and never stored:
``run_id``, ``step``, ``attempt``, ``kind`` ("text" | "reasoning"), ``text``."""

step_saved = Signal()
"""Steps and their checkpoint were committed: ``run_id``, ``steps`` (list of StepRecord)."""

run_waiting = Signal()
"""A run asked for approval and released its claim: ``run``, ``waitpoint``."""

run_settled = Signal()
"""An execution ended the run or left it interrupted: ``run`` (fresh from the database)."""

execution_ended = Signal()
"""An execution is over, in the thread that ran it: ``run_id``, ``attempt``, ``status`` (what it left
the run: ``waiting``, a terminal status or ``interrupted``; None when its claim was lost or the
database went away)."""

execution_error = Signal()
"""An execution stopped abnormally: ``run_id``, ``error`` (e.g. ``LeaseLostError``)."""

events_sent = Signal()
"""The events writer of this process recorded a batch of run events in the replay buffer and
handed it to the channel layer: ``count`` (events, after merging deltas). Sent once per batch, from
the writer's thread."""
