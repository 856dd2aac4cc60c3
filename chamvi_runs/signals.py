"""Signals sent by the engine. Receivers get keyword arguments as documented per signal."""

from django.dispatch import Signal

run_started = Signal()
"""An execution claimed the run: ``run``, ``resumed`` (bool), ``attempt``."""

run_delta = Signal()
"""A streamed text or reasoning fragment, local to the executing process and never stored:
``run_id``, ``step``, ``attempt``, ``kind`` ("text" | "reasoning"), ``text``."""

step_saved = Signal()
"""Steps and their checkpoint were committed: ``run_id``, ``steps`` (list of StepRecord)."""

run_waiting = Signal()
"""A run asked for approval and released its claim: ``run``, ``waitpoint``."""

run_settled = Signal()
"""An execution ended the run or left it interrupted: ``run`` (fresh from the database)."""

execution_error = Signal()
"""An execution stopped abnormally: ``run_id``, ``error`` (e.g. ``LeaseLostError``)."""
