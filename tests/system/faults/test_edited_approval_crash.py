"""A worker SIGKILLed after an effect approved with edited arguments committed, before its step was
saved: the run is recovered, and the refund exists once, with the arguments the approver chose."""

from __future__ import annotations

import json

import pytest

from chamvi_runs import approve, start_run
from chamvi_runs.models import EffectRecord, Run, Step, WaitPoint
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.system.faults.harness import recover, violations
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PROPOSED = {"order_id": "o-crash", "amount_cents": 4599}
EDITED = {"order_id": "o-crash", "amount_cents": 2000}


def test_an_edited_refund_whose_worker_died_before_its_step_was_saved_runs_once(server, audit, pool, queue):
    server.script(
        "m-asking",
        [
            Reply(text("Refunding."), tool_call("c1", "refund", json.dumps(PROPOSED)), finish("tool_calls")),
            Reply(text("Refunded 20.00."), finish("stop")),
        ],
    )
    run = execute(start_run("asking", "refund o-crash"))
    assert run.status == "waiting"
    queue.empty()  # the start job, executed above in this process
    approve(WaitPoint.objects.get(run=run).approval_id, arguments=EDITED)
    doomed = pool.spawn(crash_at="after_effect_record")
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash:\n{doomed.output()[-3000:]}"
    # Dead between the effect's commit and its step: the refund is there, its step is not.
    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [2000]
    assert not Step.objects.filter(run=run, kind="tool").exists()
    assert Run.objects.get(pk=run.pk).status == "running"
    recover([run.pk], pool)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "completed" and run.output == "Refunded 20.00."
    refund = Refund.objects.get()
    assert (refund.order_id, refund.amount_cents) == ("o-crash", 2000)
    record = EffectRecord.objects.get(run=run)
    assert record.input == EDITED and refund.idempotency_key == record.key
    assert pool.sink_keys() == [record.key], "the refund's side effect ran once"
    steps = list(Step.objects.filter(run=run).order_by("index").values_list("kind", "name", "input"))
    assert [s[:2] for s in steps] == [
        ("llm", "m-asking"),
        ("wait", "refund"),
        ("tool", "refund"),
        ("llm", "m-asking"),
    ]
    assert steps[2][2] == EDITED
    told = [m for m in server.requests_for("m-asking")[-1]["messages"] if m["role"] == "tool"]
    assert "changed the arguments" in told[0]["content"] and '"refunded": 2000' in told[0]["content"]
    assert len(server.requests_for("m-asking")) == 2, "the crashed execution made no model call"
    assert violations() == []
