"""Prometheus metrics: what a scrape of the /metrics view (and of a worker's own port) shows after
runs execute, who may scrape, and the system checks of the metrics settings."""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from chamvi_runs import approve, signals, start_run, store
from chamvi_runs.checks import check_metrics
from chamvi_runs.models import Run, Step, WaitPoint
from tests.support.helpers import events, execute, expire_lease, logged_in, make_user
from tests.support.processes import WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, finish, text, tool_call, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _parse(exposition: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


class Scrape:
    def __init__(self, exposition: str) -> None:
        self.text = exposition
        self.samples = _parse(exposition)

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)


def scrape(client: Client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return Scrape(response.content.decode())


def test_anonymous_and_non_staff_users_are_refused():
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    assert b"chamvi_" not in anonymous.content
    assert logged_in(make_user("plain")).get("/metrics").status_code == 403
    staff = logged_in(make_user("ops", is_staff=True)).get("/metrics")
    assert staff.status_code == 200 and b'chamvi_runs{status="completed"}' in staff.content


def test_a_scraper_reads_them_with_the_metrics_token(settings):
    header = {"Authorization": "Bearer s3cret-token"}
    assert Client().get("/metrics", headers=header).status_code == 401, "no token is configured"
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "METRICS_TOKEN": "s3cret-token"}
    assert Client().get("/metrics", headers=header).status_code == 200
    wrong = Client().get("/metrics", headers={"Authorization": "Bearer guess"})
    assert wrong.status_code == 401
    assert Client().post("/metrics", headers=header).status_code == 405


@pytest.fixture
def ops() -> Client:
    return logged_in(make_user("ops", is_staff=True))


def test_a_run_end_to_end_shows_in_steps_claims_events_tokens_and_statuses(server, ops):
    server.script(
        "m-basic",
        [
            Reply(tool_call("c1", "slow", '{"seconds": 1.0}'), finish("tool_calls"), usage(5, 2)),
            Reply(text("rested"), finish("stop"), usage(7, 1)),
        ],
    )
    before = scrape(ops)
    run = execute(start_run("basic", "rest"))
    after = scrape(ops)
    assert run.status == "completed"

    def grew(name: str, **labels: str) -> float:
        return after(name, **labels) - before(name, **labels)

    assert after("chamvi_runs", status="completed") == 1 and after("chamvi_runs", status="queued") == 0
    assert grew("chamvi_runs_settled_total", status="completed") == 1
    assert grew("chamvi_step_duration_seconds_count", kind="llm") == 2
    assert grew("chamvi_step_duration_seconds_count", kind="tool") == 1
    # The durations are the stored steps': a model call's step ends with the call, before its tool.
    stored = list(Step.objects.filter(run=run).order_by("index"))
    assert stored[0].finished_at <= stored[1].started_at
    for kind in ("llm", "tool"):
        seconds = sum((s.finished_at - s.started_at).total_seconds() for s in stored if s.kind == kind)
        assert grew("chamvi_step_duration_seconds_sum", kind=kind) == pytest.approx(seconds, abs=0.05)
    assert grew("chamvi_step_duration_seconds_sum", kind="tool") >= 1.0, "the tool slept a second"
    assert grew("chamvi_claim_latency_seconds_count", since="created") == 1
    assert grew("chamvi_model_tokens_total", direction="input") == 12
    assert grew("chamvi_model_tokens_total", direction="output") == 3
    # Every event the run's viewers can replay went out once, merged deltas counted once.
    assert grew("chamvi_events_sent_total") == len(events(run)) > 0
    assert grew("chamvi_recoveries_total") == grew("chamvi_lease_losses_total") == 0


@pytest.fixture
def thief() -> Iterator[list[str]]:
    """Another worker takes the run over at its first delta, as if this one had frozen meanwhile."""
    stolen: list[str] = []

    def steal(sender, run_id, **kwargs):
        if not stolen:
            expire_lease(run_id)
            assert store.claim(run_id, "thief", 30) is not None
            stolen.append(run_id)

    signals.run_delta.connect(steal)
    yield stolen
    signals.run_delta.disconnect(steal)


def test_a_lost_lease_is_counted_and_an_expired_one_shows_until_recovered(server, ops, thief):
    server.script(
        "m-basic",
        [
            Reply(text("one "), text("two"), finish("stop")),
            Reply(text("recovered"), finish("stop")),
        ],
    )
    before = scrape(ops)
    run = execute(start_run("basic", "x"))
    lost = scrape(ops)
    assert thief == [run.pk] and (run.status, run.claim_owner) == ("running", "thief")
    assert lost("chamvi_lease_losses_total") - before("chamvi_lease_losses_total") == 1
    errors = "chamvi_execution_errors_total"
    assert lost(errors, error="LeaseLostError") - before(errors, error="LeaseLostError") == 1
    assert lost("chamvi_leases_expired") == 0, "the thief's lease is live"

    # The thief dies: its lease runs out, and the run waits for recovery until an execution resumes it.
    expire_lease(run.pk)
    assert scrape(ops)("chamvi_leases_expired") == 1
    assert execute(run).status == "completed"
    recovered = scrape(ops)
    assert recovered("chamvi_leases_expired") == 0
    assert recovered("chamvi_recoveries_total") - lost("chamvi_recoveries_total") == 1
    assert recovered("chamvi_claim_latency_seconds_count", since="created") == lost(
        "chamvi_claim_latency_seconds_count", since="created"
    ), "a recovery is no first claim"


def test_an_approval_waits_in_the_gauge_and_its_decision_starts_the_claim_latency(server, ops):
    server.script(
        "m-approving",
        [
            Reply(
                tool_call("c1", "refund", '{"order_id": "o-1", "amount_cents": 500}'), finish("tool_calls")
            ),
            Reply(text("Refunded."), finish("stop")),
        ],
    )
    before = scrape(ops)
    run = execute(start_run("approving", "refund"))
    waiting = scrape(ops)
    assert run.status == "waiting"
    assert waiting("chamvi_approvals_waiting") == 1 and waiting("chamvi_runs", status="waiting") == 1
    steps = "chamvi_step_duration_seconds_count"
    assert waiting(steps, kind="wait") - before(steps, kind="wait") == 1
    approve(WaitPoint.objects.get(run=run).approval_id)
    assert execute(run).status == "completed"
    done = scrape(ops)
    assert done("chamvi_approvals_waiting") == 0 and done("chamvi_runs", status="completed") == 1
    latency = "chamvi_claim_latency_seconds_count"
    assert done(latency, since="decision") - waiting(latency, since="decision") == 1
    assert done("chamvi_recoveries_total") == waiting("chamvi_recoveries_total"), "a decision is no recovery"


# --- worker processes ---------------------------------------------------------------------------


def _basic_run(server) -> Run:
    server.script(
        "m-basic",
        [
            Reply(text("Adding."), tool_call("c1", "add", '{"a": 2, "b": 3}'), finish("tool_calls")),
            Reply(text("5"), finish("stop")),
        ],
    )
    return start_run("basic", "2+3")


def _completed(run: Run, worker: WorkerProcess) -> None:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == "completed",
        30,
        lambda: "the run to complete\n" + worker.output(),
    )


def test_a_worker_serves_its_own_metrics_on_its_port(server):
    worker = WorkerProcess(worker_env(server.base_url, CHAMVI_METRICS_PORT="0", CHAMVI_LOG_JSON="1"))
    try:
        served = wait_for(
            lambda: re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", worker.output()),
            30,
            lambda: "the metrics port in the log\n" + worker.output(),
        )
        url = served.group(1)
        run = _basic_run(server)
        _completed(run, worker)

        def read() -> Scrape:
            with urllib.request.urlopen(url, timeout=5) as response:
                return Scrape(response.read().decode())

        # The settle is announced, and counted, a moment after it is committed.
        metrics = wait_for(
            lambda: (m := read())("chamvi_runs_settled_total", status="completed") == 1 and m,
            10,
            lambda: "the settle counted\n" + read().text,
        )
        assert metrics("chamvi_step_duration_seconds_count", kind="llm") == 2
        assert metrics("chamvi_step_duration_seconds_count", kind="tool") == 1
        assert metrics("chamvi_claim_latency_seconds_count", since="created") == 1
        assert metrics("chamvi_events_sent_total") > 0
        # The database's gauges are the web view's: every worker serving them would multiply them.
        assert "chamvi_runs{" not in metrics.text
    finally:
        worker.stop()


def test_multiprocess_mode_serves_a_worker_s_metrics_through_the_view(server, ops, tmp_path, monkeypatch):
    env = worker_env(server.base_url, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    worker = WorkerProcess(env)
    try:
        run = _basic_run(server)
        _completed(run, worker)
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        # This process writes nothing there: what the view shows of steps is the worker's.
        metrics = wait_for(
            lambda: (m := scrape(ops))("chamvi_runs_settled_total", status="completed") == 1 and m,
            10,
            lambda: "the worker's settle in the directory\n" + worker.output(),
        )
        assert metrics("chamvi_step_duration_seconds_count", kind="llm") == 2
        assert metrics("chamvi_runs", status="completed") == 1
    finally:
        worker.stop()


# --- system checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "id_"),
    [
        ({"METRICS_PORT": "9100"}, "E021"),
        ({"METRICS_PORT": 70000}, "E021"),
        ({"METRICS_PORT": True}, "E021"),
        ({"METRICS_ADDR": ""}, "E022"),
        ({"METRICS_TOKEN": ""}, "E023"),
        ({"METRICS_TOKEN": 123}, "E023"),
    ],
)
def test_wrong_metrics_settings_are_errors_naming_the_key(settings, overrides, id_):
    assert check_metrics() == []
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, **overrides}
    [error] = check_metrics()
    assert error.id == f"chamvi_runs.{id_}"
    assert error.msg.startswith(f"CHAMVI_RUNS['{next(iter(overrides))}']"), error.msg


@pytest.mark.parametrize("key", ["METRICS_PORT", "METRICS_TOKEN"])
def test_metrics_settings_without_prometheus_client_are_an_error(settings, monkeypatch, key):
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, key: 9100 if key == "METRICS_PORT" else "t"}
    assert check_metrics() == []
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    [error] = check_metrics()
    assert error.id == "chamvi_runs.E024" and f"CHAMVI_RUNS['{key}']" in error.msg
    assert "chamvi-runs[metrics]" in (error.hint or "")


def test_good_metrics_settings_pass(settings):
    settings.CHAMVI_RUNS = {
        **settings.CHAMVI_RUNS,
        "METRICS_PORT": 9100,
        "METRICS_ADDR": "0.0.0.0",
        "METRICS_TOKEN": "a-long-random-token",
    }
    assert check_metrics() == []
