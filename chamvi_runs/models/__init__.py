"""Run, Step, Checkpoint, WaitPoint and their helpers. Fields, constraints and indexes only:
every write of run state goes through ``chamvi_runs.store``.

A package, one module per concern: ``runs`` (a run, its thread, its steps and its checkpoint),
``waits``, ``inputs``, ``records`` (attachments, effect results, API tokens), ``workers`` (the agent versions
of the processes that execute runs) and ``ids``. Every name
is re-exported here: sites import them from ``chamvi_runs.models``, and the migrations name the id
factories by that path."""

from __future__ import annotations

# isort: off
# In the order the single module defined them: Django registers models in that order, and creates
# content types and permissions, and lists models, in the order it registered them.
from .ids import new_approval_id, new_artifact_id, new_id, new_input_id, new_run_id
from .runs import Checkpoint, Run, Step, StuckRun, Thread
from .waits import WaitPoint
from .inputs import RunInput
from .records import ApiToken, Artifact, EffectRecord
from .workers import WorkerVersion

# isort: on

__all__ = [
    "ApiToken",
    "Artifact",
    "Checkpoint",
    "EffectRecord",
    "Run",
    "RunInput",
    "Step",
    "StuckRun",
    "Thread",
    "WaitPoint",
    "WorkerVersion",
    "new_approval_id",
    "new_artifact_id",
    "new_id",
    "new_input_id",
    "new_run_id",
]
