"""Leases and effect tools on the real PostgreSQL: the lease keeper's one renewal statement waits on no
row lock, and an effect tool in flight holds its run (no claim, no cancel settles it) without
locking the run's row. A worker process running two runs at once: tests/system/test_worker_process.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import transaction

from chamvi_runs import cancel_run, start_run, store
from chamvi_runs.models import EffectRecord, Run
from tests.integration.test_claims_and_steering import _in_thread
from tests.support.helpers import execute, expire_lease
from tests.support.scripted_server import Reply, finish, tool_call
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def test_renewing_many_leases_never_waits_for_a_row_another_transaction_holds():
    busy, free = start_run("basic", "busy"), start_run("basic", "free")
    claims = [store.claim(busy.pk, "w1", 5), store.claim(free.pk, "w1", 5)]
    assert None not in claims
    expiry = dict(Run.objects.values_list("pk", "claim_expires_at"))
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk=busy.pk))
            locked.set()
            release.wait(20)

    holder, _ = _in_thread(hold_lock)
    try:
        assert locked.wait(5)
        renewal, result = _in_thread(store.renew_many, claims, 60)
        # Bounded by the lock, which is held until release below.
        renewal.join(10)
        assert not renewal.is_alive(), "the renewal waited for a row another transaction holds"
    finally:
        release.set()
        holder.join(5)
    # The busy run's claim is intact: held, not lost; its lease is renewed by the next heartbeat.
    assert result == {"value": {busy.pk, free.pk}}
    after = dict(Run.objects.values_list("pk", "claim_expires_at"))
    assert after[busy.pk] == expiry[busy.pk] and after[free.pk] > expiry[free.pk] + timedelta(seconds=30)


def _appears(path, what: str) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_no_other_execution_claims_a_run_while_its_effect_tool_runs(server, monkeypatch, tmp_path):
    monkeypatch.setenv("CHAMVI_TEST_GATE", str(tmp_path))
    refund = tool_call("c1", "gated_refund", '{"order_id": "o-1", "amount_cents": 5}')
    server.script("m-gated_effects", [Reply(refund, finish("tool_calls"))])
    run = start_run("gated_effects", "refund")
    execution, result = _in_thread(execute, run.pk)
    try:
        _appears(tmp_path / f"{run.pk}.inside", "the effect tool to start")
        # As if its worker had frozen past its lease: the lease ends, and (held by this transaction,
        # which the lease keeper passes over) stays ended for the claim and the cancel.
        with transaction.atomic():
            expire_lease(run.pk)
            assert store.claim(run.pk, "another-worker", 5) is None
            # Nor does a cancel settle the run under its effect: it asks the execution to.
            assert cancel_run(run.pk) == "running"
        _appears(tmp_path / f"{run.pk}.aborted", "the execution to see the cancel while the tool runs")
    finally:
        (tmp_path / "open").touch()
        execution.join(10)
    assert "error" not in result
    run.refresh_from_db()
    assert (run.status, run.attempt) == ("cancelled", 1)
    assert Refund.objects.count() == 1 and EffectRecord.objects.filter(run=run).count() == 1
