"""One recovery: a run streams a long paced reply in one worker while another waits idle; the bench
SIGKILLs the executing worker mid-stream and watches the database every 20 ms until another worker
claims the run, writes its next step and completes it."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from django.db import connection

from bench.common.stack import Worker, wait_for
from bench.common.stamping_model import StampingModel

POLL = 0.02


@dataclass
class Recovery:
    kill_after_claim_s: float
    reclaim_s: float
    next_step_s: float
    completed_s: float
    attempts: int
    reclaimed_by_other: bool
    status: str


def _row(run_id: str) -> dict[str, Any]:
    from chamvi_runs.models import Run, Step

    row = Run.objects.values("status", "attempt", "claim_owner").get(pk=run_id)
    row["steps"] = Step.objects.filter(run_id=run_id).count()
    return row


def _owner_pid(owner: str | None) -> int | None:
    # worker_identity(): host:pid:thread:nonce
    return int(owner.split(":")[1]) if owner else None


def recover_once(
    user: Any, model: StampingModel, workers: list[Worker], reply_seconds: float, timeout: float
) -> Recovery:
    from chamvi_runs import start_run
    from chamvi_runs.core.states import TERMINAL

    terminal = {s.value for s in TERMINAL}
    served = model.status()["served"]
    run_id = start_run("basic", {"tag": "recovery"}, created_by=user).pk
    wait_for(lambda: _row(run_id)["claim_owner"], 30, "the run to be claimed")
    claimed = time.monotonic()
    first = _row(run_id)
    victim = next(w for w in workers if w.pid == _owner_pid(first["claim_owner"]))
    wait_for(lambda: model.status()["active"] >= 1, 30, "the model stream to start")
    # Anywhere in the stream but its first and last second.
    time.sleep(random.uniform(1.0, max(1.0, reply_seconds - 1.0)))
    if _row(run_id)["steps"] or model.status()["served"] > served:
        raise RuntimeError("the stream ended before the kill: raise --reply-seconds")
    killed = time.monotonic()
    victim.kill()
    reclaimed = next_step = None
    while True:
        row = _row(run_id)
        now = time.monotonic()
        if reclaimed is None and row["attempt"] > first["attempt"] and row["claim_owner"]:
            reclaimed, new_owner = now, row["claim_owner"]
        if next_step is None and row["steps"] > first["steps"]:
            next_step = now
        if row["status"] in terminal:
            break
        if now - killed > timeout:
            raise TimeoutError(f"run {run_id} not settled {timeout}s after the kill: {row}")
        time.sleep(POLL)
    connection.close()
    workers.remove(victim)
    return Recovery(
        kill_after_claim_s=killed - claimed,
        reclaim_s=(reclaimed or now) - killed,
        next_step_s=(next_step or now) - killed,
        completed_s=now - killed,
        attempts=row["attempt"],
        reclaimed_by_other=reclaimed is not None and _owner_pid(new_owner) != victim.pid,
        status=row["status"],
    )
