"""The fault-injection harness: a pool of real worker processes, a model whose replies depend on
the history (so many runs share it), database triggers that record fencing violations, a recovery
driver and one checker for every scenario."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import F

from chamvi_runs.core.messages import open_tool_calls
from chamvi_runs.core.states import TERMINAL
from chamvi_runs.models import Checkpoint, EffectRecord, Run, Step
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import expire_lease
from tests.support.processes import WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, ScriptedServer, delay, finish, text, tool_call, usage
from tests.testapp.models import Refund

MODEL = "m-faulty"

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS chamvi_fault_violation (
    id bigserial PRIMARY KEY, kind text NOT NULL, run_id text NOT NULL, detail text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION chamvi_fault_step_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    SELECT attempt, status INTO r FROM chamvi_runs_run WHERE id = NEW.run_id;
    IF r.attempt IS DISTINCT FROM NEW.attempt THEN
        INSERT INTO chamvi_fault_violation (kind, run_id, detail) VALUES ('stale_write', NEW.run_id,
            format('step %s written by attempt %s while the run is at attempt %s',
                   NEW.index, NEW.attempt, r.attempt));
    END IF;
    IF r.status IN ('completed', 'failed', 'cancelled') THEN
        INSERT INTO chamvi_fault_violation (kind, run_id, detail) VALUES ('write_after_settle', NEW.run_id,
            format('step %s written after the run settled %s', NEW.index, r.status));
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS chamvi_fault_step_fence ON chamvi_runs_step;
CREATE TRIGGER chamvi_fault_step_fence BEFORE INSERT ON chamvi_runs_step
    FOR EACH ROW EXECUTE FUNCTION chamvi_fault_step_fence();

CREATE OR REPLACE FUNCTION chamvi_fault_run_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempt > OLD.attempt AND OLD.claim_owner IS NOT NULL
       AND OLD.claim_expires_at > statement_timestamp() THEN
        INSERT INTO chamvi_fault_violation (kind, run_id, detail) VALUES ('overlap', NEW.id,
            format('attempt %s claimed while attempt %s held a live lease', NEW.attempt, OLD.attempt));
    END IF;
    IF OLD.status IN ('completed', 'failed', 'cancelled') AND (NEW.status, NEW.output, NEW.error_code,
       NEW.input_tokens, NEW.output_tokens, NEW.attempt, NEW.claim_owner)
       IS DISTINCT FROM (OLD.status, OLD.output, OLD.error_code, OLD.input_tokens, OLD.output_tokens,
       OLD.attempt, OLD.claim_owner) THEN
        INSERT INTO chamvi_fault_violation (kind, run_id, detail) VALUES ('write_after_settle', NEW.id,
            format('run changed after it settled %s', OLD.status));
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS chamvi_fault_run_fence ON chamvi_runs_run;
CREATE TRIGGER chamvi_fault_run_fence BEFORE UPDATE ON chamvi_runs_run
    FOR EACH ROW EXECUTE FUNCTION chamvi_fault_run_fence();
TRUNCATE chamvi_fault_violation;
"""


def install_audit() -> None:
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_SQL)


def violations() -> list[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, run_id, detail FROM chamvi_fault_violation ORDER BY id")
        return list(cursor.fetchall())


def _tag_of(body: dict[str, Any]) -> str:
    """The run a model request belongs to: the tag in its trigger payload."""
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            block = content[0]["text"] if isinstance(content, list) else content
            try:
                return json.loads(block)["payload"]["tag"]
            except (ValueError, KeyError, TypeError):
                continue
    return "?"


@dataclass
class FaultyModel:
    """Two model calls per run: text, a pause, then a refund (effect) and an add; then a final
    answer after another pause. Tool-call ids are new on every call, as a real model's are."""

    server: ScriptedServer
    pause: float = 0.3
    calls: Counter[str] = field(default_factory=Counter)

    def install(self) -> None:
        self.server.respond(MODEL, self.reply)

    def reply(self, body: dict[str, Any]) -> Reply:
        tag = _tag_of(body)
        self.calls[tag] += 1
        answered = [m for m in body["messages"] if m["role"] == "tool"]
        if not answered:
            refund = json.dumps({"order_id": tag, "amount_cents": 100})
            return Reply(
                text("Refunding "),
                delay(self.pause),
                text(f"order {tag}."),
                tool_call(f"call_{secrets.token_hex(4)}", "refund", refund),
                tool_call(f"call_{secrets.token_hex(4)}", "add", '{"a": 2, "b": 3}'),
                finish("tool_calls"),
                usage(20, 10),
            )
        return Reply(text("Refunded "), delay(self.pause), text("and done."), finish("stop"), usage(30, 5))


# A concurrent worker's threads share a pool smaller than their number, as docs/deployment.md
# advises: a thread hands its connection back while its run waits on the model.
CONCURRENT_POOL = 3


class WorkerPool:
    """Worker processes of one scenario. ``concurrency`` above 1 makes every worker execute that
    many runs at once (``CHAMVI_CONCURRENCY``) on a connection pool of ``CONCURRENT_POOL``."""

    def __init__(self, server: ScriptedServer, concurrency: int = 1) -> None:
        self.server = server
        self.concurrency = concurrency
        self.workers: list[WorkerProcess] = []
        self.sink = Path(tempfile.mkstemp(prefix="chamvi-sink-")[1])
        self.marker = Path(tempfile.mkdtemp(prefix="chamvi-crash-"))

    def spawn(self, crash_at: str = "") -> WorkerProcess:
        env = worker_env(
            self.server.base_url,
            CHAMVI_EFFECT_SINK=str(self.sink),
            CHAMVI_CRASH_AT=crash_at,
            CHAMVI_CRASH_MARKER=str(self.marker),
        )
        if self.concurrency > 1:
            env["CHAMVI_CONCURRENCY"] = str(self.concurrency)
            env["DATABASE_URL"] += f"?pool={CONCURRENT_POOL}"
        worker = WorkerProcess(env)
        self.workers.append(worker)
        return worker

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    def ensure(self, count: int) -> None:
        while len(self.alive()) < count:
            self.spawn()

    def sink_keys(self) -> list[str]:
        return [line for line in self.sink.read_text().splitlines() if line]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.sink.unlink(missing_ok=True)
        for path in self.marker.iterdir():
            path.unlink()
        self.marker.rmdir()


def start_tagged(count: int, agent: str = "faulty", **kwargs: Any) -> dict[str, str]:
    """Start ``count`` runs, each with a unique tag in its payload; returns tag -> run id."""
    from chamvi_runs import start_run

    runs = {}
    for _ in range(count):
        tag = secrets.token_hex(4)
        runs[tag] = start_run(agent, {"tag": tag}, **kwargs).pk
    return runs


def held_by(pid: int) -> list[Run]:
    """The runs process ``pid`` holds (owners are ``host:pid:thread:nonce``). Read after a SIGKILL
    it is exact: a dead process releases nothing, and its leases have not expired yet."""
    return list(Run.objects.filter(claim_owner__contains=f":{pid}:", status="running"))


def _pid_alive(owner: str | None) -> bool:
    if not owner:
        return False
    try:
        os.kill(int(owner.split(":")[1]), 0)
    except (ProcessLookupError, ValueError, IndexError):
        return False
    except PermissionError:
        return True
    return True


def recover(run_ids: Iterable[str], pool: WorkerPool, *, workers: int = 2, timeout: float = 60) -> None:
    """Drive runs to a final status the way production does: chamvi_tick re-enqueues what needs a
    worker. Leases of dead owners are moved into the past in SQL instead of waiting them out."""
    ids = list(run_ids)
    deadline = time.monotonic() + timeout
    while True:
        pool.ensure(workers)
        for run in Run.objects.filter(pk__in=ids, status="running", claim_owner__isnull=False):
            if not _pid_alive(run.claim_owner):
                expire_lease(run.pk, attempt=run.attempt)
        Run.objects.filter(pk__in=ids, status__in=["queued", "interrupted"]).update(
            updated_at=F("updated_at") - timedelta(hours=1)
        )
        tick_once()
        if not Run.objects.filter(pk__in=ids).exclude(status__in=[s.value for s in TERMINAL]).exists():
            return
        if time.monotonic() > deadline:
            stuck = list(
                Run.objects.filter(pk__in=ids)
                .exclude(status__in=[s.value for s in TERMINAL])
                .values_list("pk", "status", "claim_owner")
            )
            logs = "\n".join(w.output()[-2000:] for w in pool.workers[-2:])
            raise AssertionError(f"stuck runs: {stuck}\n{logs}")
        time.sleep(0.1)


@dataclass
class Report:
    runs: int = 0
    completed: int = 0
    cancelled: int = 0
    model_calls: int = 0
    llm_steps: int = 0
    effect_executions: int = 0
    effects_applied: int = 0


def check(
    runs: dict[str, str],
    model: FaultyModel,
    pool: WorkerPool,
    faults: Counter[str] | None = None,
    allowed: Iterable[str] = ("completed",),
) -> Report:
    """Every invariant, for every run of a scenario. ``faults`` counts faults injected per tag."""
    faults = faults or Counter()
    report = Report(runs=len(runs))
    sink = Counter(pool.sink_keys())
    for tag, run_id in runs.items():
        run = Run.objects.get(pk=run_id)
        assert run.status in allowed, f"{run_id}: {run.status} {run.error_code} {run.error_message}"
        assert run.claim_owner is None, f"{run_id} settled but still claimed"
        steps = list(Step.objects.filter(run=run).order_by("index"))
        assert [s.index for s in steps] == list(range(len(steps))), f"{run_id}: steps not contiguous"
        if steps:
            checkpoint = Checkpoint.objects.get(run=run)
            assert checkpoint.step_index == steps[-1].index, f"{run_id}: checkpoint behind its steps"
            assert not open_tool_calls(checkpoint.messages), f"{run_id}: history ends on open tool calls"
        llm = sum(1 for s in steps if s.kind == "llm")
        # Every call made is counted, saved or not (SPEC §5): a fault or a cancel that cut a call
        # leaves it counted without a step.
        aborted = faults[tag] + (run.status == "cancelled")
        assert llm <= run.model_calls <= llm + aborted, f"{run_id}: {run.model_calls} counted, {llm} saved"
        assert model.calls[tag] <= llm + faults[tag], (
            f"{run_id}: {model.calls[tag]} model calls for {llm} steps and {faults[tag]} faults"
        )
        keys = {k for k in sink if k.startswith(f"{run_id}:")}
        records = EffectRecord.objects.filter(run=run)
        refunds = Refund.objects.filter(order_id=tag).count()
        assert len(keys) <= 1, f"{run_id}: the effect ran under {len(keys)} idempotency keys"
        assert refunds == records.count() <= 1, (
            f"{run_id}: {refunds} Django writes, {records.count()} records"
        )
        if run.status == "completed":
            assert records.count() == 1 and len(keys) == 1, f"{run_id}: completed without its effect"
            assert [s.kind for s in steps] == ["llm", "tool", "tool", "llm"], (
                f"{run_id}: {[(s.index, s.kind, s.name, s.attempt, s.error, s.output) for s in steps]}"
            )
            assert run.output == "Refunded and done."
        report.completed += run.status == "completed"
        report.cancelled += run.status == "cancelled"
        report.model_calls += model.calls[tag]
        report.llm_steps += llm
        report.effect_executions += sum(sink[k] for k in keys)
        report.effects_applied += len(keys)
    assert violations() == [], violations()
    return report


def kill_at_random(worker: WorkerProcess, low: float, high: float) -> float:
    pause = random.uniform(low, high)
    time.sleep(pause)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    return pause


__all__ = [
    "FaultyModel",
    "Report",
    "WorkerPool",
    "check",
    "held_by",
    "install_audit",
    "recover",
    "start_tagged",
    "wait_for",
]
