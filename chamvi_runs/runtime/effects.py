"""Effect tools: the side effect runs at most once per run and tool call.

The record and the tool's own Django writes share one transaction, which takes the run's effect
lock and checks the claim first (``store.lock_for_effect``) and renews the lease, fenced on the
claim, last: a Django write is therefore exactly once, a stale worker (lost lease) runs nothing, and
no other execution claims the run while the tool runs. The run row is not locked meanwhile: the
lease keeper renews every lease of the process and a cancel lands at once, however long the tool.
For calls to the outside world, ``ctx.idempotency_key`` is stable across re-executions of the same
step so the remote API can deduplicate; see docs/effects.md for each crash point.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import transaction

from .. import store
from ..agents.agent import RunContext
from ..agents.tools import Tool, to_jsonable
from ..conf import conf
from ..core.faults import crash_point
from ..core.records import Claim
from ..errors import LeaseLostError
from ..models import EffectRecord

logger = logging.getLogger(__name__)


def run_effect(claim: Claim, tool: Tool, ctx: RunContext, arguments: dict[str, Any]) -> tuple[Any, str]:
    key = ctx.idempotency_key
    assert key is not None
    with transaction.atomic():
        if not store.lock_for_effect(claim):
            raise LeaseLostError(f"run {claim.run_id}: claim lost before an effect tool")
        record = store.effect_record(claim.run_id, key)
        if record is not None:
            if record.input != to_jsonable(arguments):
                return None, _already_ran(tool.name, record)
            return record.output, record.error
        output: Any = None
        error = ""
        try:
            # A savepoint: a raising tool rolls back its own writes, and the error is still recorded
            # so a repeat does not run the effect again.
            with transaction.atomic():
                output = to_jsonable(tool.invoke(ctx, arguments))
        except LeaseLostError:
            raise
        except Exception as exc:
            logger.info("effect tool %s raised", tool.name, exc_info=True)
            error = f"{type(exc).__name__}: {exc}"
        store.record_effect(claim, key, tool.name, to_jsonable(arguments), output, error)
        # The fence, checked again with the row locked until the commit; and a full lease from
        # now, so a tool longer than the lease does not commit into a lease that just ran out.
        if not store.renew(claim, conf.LEASE_SECONDS):
            # Rolls back the record and the tool's writes: they commit under this claim or not at all.
            raise LeaseLostError(f"run {claim.run_id}: claim lost while an effect tool ran")
    crash_point("after_effect_record")
    return output, error


def _already_ran(name: str, record: EffectRecord) -> str:
    """A repeated model call put the same tool at the same place with other arguments (the first
    execution died after the effect and before its step was saved). The effect is not run again:
    the model is told what did run."""
    result = {"error": record.error} if record.error else {"output": record.output}
    return (
        f"not run: {name} already ran once for this call (it runs at most once), with arguments "
        f"{json.dumps(record.input, ensure_ascii=False)}, and gave {json.dumps(result, ensure_ascii=False)}"
    )
