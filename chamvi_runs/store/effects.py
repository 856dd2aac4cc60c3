"""The records of effect tools: each effect runs at most once per run and tool call."""

from __future__ import annotations

from typing import Any

from ..core.records import Claim
from ..core.storable import storable
from ..models import EffectRecord, Run
from .fence import held


def lock_for_effect(claim: Claim) -> bool:
    """Inside the effect's atomic block: lock the run row while the claim holds it, so the effect,
    its record and the tool's own writes commit under this claim or not at all. False: the claim is
    lost, and the tool must not run."""
    return Run.objects.select_for_update().filter(held(claim)).exists()


def effect_record(run_id: str, key: str) -> EffectRecord | None:
    """The record of ``key`` if the effect already ran."""
    return EffectRecord.objects.filter(run_id=run_id, key=key).first()


def record_effect(claim: Claim, key: str, tool_name: str, tool_input: Any, output: Any, error: str) -> None:
    """Inside the block that holds ``lock_for_effect``: a second record of a key is an IntegrityError."""
    EffectRecord.objects.create(
        run_id=claim.run_id,
        key=key,
        tool_name=storable(tool_name),
        input=storable(tool_input),
        output=storable(output),
        error=storable(error),
    )
