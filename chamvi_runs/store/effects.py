"""The records of effect tools: each effect runs at most once per run and tool call."""

from __future__ import annotations

from typing import Any

from ..core.records import Claim
from ..core.storable import storable
from ..models import EffectRecord, Run
from . import step_sql
from .fence import effect_lock, held


def lock_for_effect(claim: Claim) -> bool:
    """First in the effect's atomic block: take the run's effect lock (``fence.effect_lock``), then
    check that the claim still holds the run. No claim is taken while the lock is held, so no other
    execution runs the tool meanwhile; the caller renews the lease, fenced, right before its commit
    (``claims.renew``), so the effect, its record and the tool's own writes commit under this claim
    or not at all. False: the claim is lost, and the tool must not run. (On SQLite the transaction
    itself holds the database's write lock until it commits, and every other write waits.)"""
    effect_lock(claim.run_id, wait=True)
    # A statement of its own, after the lock: its snapshot sees a claim committed while it waited.
    if step_sql.applies():
        return step_sql.holds(claim)
    return Run.objects.filter(held(claim)).exists()


def effect_record(run_id: str, key: str) -> EffectRecord | None:
    """The record of ``key`` if the effect already ran."""
    if step_sql.applies():
        return step_sql.effect_record(run_id, key)
    return EffectRecord.objects.filter(run_id=run_id, key=key).first()


def record_effect(claim: Claim, key: str, tool_name: str, tool_input: Any, output: Any, error: str) -> None:
    """Inside the block that took ``lock_for_effect``: a second record of a key is an IntegrityError."""
    fields = {
        "run_id": claim.run_id,
        "key": key,
        "tool_name": storable(tool_name),
        "input": storable(tool_input),
        "output": storable(output),
        "error": storable(error),
    }
    if step_sql.applies():
        step_sql.record_effect(fields)
    else:
        EffectRecord.objects.create(**fields)
