"""Prometheus metrics (the ``metrics`` extra: prometheus-client). The app connects ``connect``'s
receivers at startup when prometheus-client is installed; the engine never imports it: what it
does reaches these metrics through ``chamvi_runs.signals``.

Counted by each process, for what it does (workers: their executions and events; web processes:
their cancels, and in embedded mode their executions too):

- ``chamvi_step_duration_seconds{kind}`` (histogram): a step's ``finished_at - started_at``
  (``llm``: the model call; ``tool``: until its model call's steps are written; ``wait``: ~0).
- ``chamvi_claim_latency_seconds{since}`` (histogram): from when a run became claimable to its
  claim, both by the database's clock: ``since="created"`` for a run's first claim
  (``started_at - created_at``; a run held back by its concurrency key or thread counts the time
  it waited), ``since="decision"`` for the claim that resumes it after an approval was decided or
  expired (``updated_at`` of the claim ``- decided_at``). Other claims record no time: the row no
  longer says when they became claimable.
- ``chamvi_recoveries_total``: executions that resumed a run another execution had left
  unfinished, not after a decision: its worker was drained (``interrupted``) or lost its lease
  (died, froze), and chamvi_tick handed the run on.
- ``chamvi_lease_losses_total``: executions that stopped because their claim was lost.
- ``chamvi_execution_errors_total{error}``: executions that stopped abnormally, by exception class.
- ``chamvi_runs_settled_total{status}``: settles announced (terminal statuses and ``interrupted``).
- ``chamvi_events_sent_total``: run events recorded and handed to the channel layer.
- ``chamvi_model_tokens_total{direction}``: tokens of saved model calls (``input``, ``output``).

Read from the database when ``metrics_view`` is scraped (three small queries), never counted by a
process: ``chamvi_runs{status}``, ``chamvi_approvals_waiting`` and ``chamvi_leases_expired``
(running runs whose lease ran out: recovery pending; a lasting value means no chamvi_tick runs).

``metrics_view`` serves this process's metrics (with ``PROMETHEUS_MULTIPROC_DIR`` set, those of
every process that shares the directory) and the database's. A worker process serves its own on
``CHAMVI_RUNS["METRICS_PORT"]`` (``serve``, called by ``chamvi_runs.worker.Worker``).
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from . import signals
from .conf import conf
from .core.states import Status
from .errors import LeaseLostError
from .models import Run, WaitPoint
from .store.queries import lease_expired

logger = logging.getLogger(__name__)

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

STEP_SECONDS = Histogram(
    "chamvi_step_duration_seconds", "Duration of saved steps, by kind.", ["kind"], buckets=SECONDS
)
CLAIM_LATENCY = Histogram(
    "chamvi_claim_latency_seconds",
    "Seconds from when a run became claimable (created, or its approval decided) to its claim.",
    ["since"],
    buckets=SECONDS,
)
RECOVERIES = Counter(
    "chamvi_recoveries", "Executions that resumed a run another execution had left unfinished."
)
LEASE_LOSSES = Counter("chamvi_lease_losses", "Executions that stopped because their claim was lost.")
EXECUTION_ERRORS = Counter(
    "chamvi_execution_errors", "Executions that stopped abnormally, by exception class.", ["error"]
)
SETTLED = Counter("chamvi_runs_settled", "Settles announced by this process, by status.", ["status"])
EVENTS_SENT = Counter("chamvi_events_sent", "Run events recorded and handed to the channel layer.")
TOKENS = Counter("chamvi_model_tokens", "Tokens of saved model calls.", ["direction"])

# The series of every known label, resolved once: each is exported from the start (at 0), and a
# step's receiver looks none up.
_STEPS = {kind: STEP_SECONDS.labels(kind) for kind in ("llm", "tool", "wait")}
_TOKENS = {direction: TOKENS.labels(direction) for direction in ("input", "output")}
_LATENCY = {since: CLAIM_LATENCY.labels(since) for since in ("created", "decision")}


def _safe(receiver: Callable[..., None]) -> Callable[..., None]:
    """A receiver's error never reaches the engine: a signal's send raises what its receivers raise."""

    @functools.wraps(receiver)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:
            logger.warning("metrics receiver %s failed", receiver.__name__, exc_info=True)

    return guarded


@_safe
def on_run_started(
    sender: Any, run: Run, resumed: bool, decision: WaitPoint | None = None, **kwargs: Any
) -> None:
    if not resumed:
        if run.started_at is not None:
            _LATENCY["created"].observe(max(0.0, (run.started_at - run.created_at).total_seconds()))
    elif decision is not None:
        if decision.decided_at is not None:
            # The claim wrote updated_at, by the database's clock as decided_at.
            waited = (run.updated_at - decision.decided_at).total_seconds()
            _LATENCY["decision"].observe(max(0.0, waited))
    else:
        RECOVERIES.inc()


@_safe
def on_step_saved(sender: Any, steps: list[Any], **kwargs: Any) -> None:
    now = timezone.now()
    for step in steps:
        if step.started_at is not None:
            duration = ((step.finished_at or now) - step.started_at).total_seconds()
            (_STEPS.get(step.kind) or STEP_SECONDS.labels(step.kind)).observe(max(0.0, duration))
        if step.kind == "llm":
            usage = (step.output or {}).get("usage") or {}
            for direction, counter in _TOKENS.items():
                counter.inc(usage.get(f"{direction}_tokens") or 0)


@_safe
def on_execution_error(sender: Any, error: BaseException, **kwargs: Any) -> None:
    EXECUTION_ERRORS.labels(type(error).__name__).inc()
    if isinstance(error, LeaseLostError):
        LEASE_LOSSES.inc()


@_safe
def on_run_settled(sender: Any, run: Run, **kwargs: Any) -> None:
    SETTLED.labels(run.status).inc()


@_safe
def on_events_sent(sender: Any, count: int, **kwargs: Any) -> None:
    EVENTS_SENT.inc(count)


def connect() -> None:
    """Count what the engine signals (idempotent)."""
    for signal, receiver in (
        (signals.run_started, on_run_started),
        (signals.step_saved, on_step_saved),
        (signals.execution_error, on_execution_error),
        (signals.run_settled, on_run_settled),
        (signals.events_sent, on_events_sent),
    ):
        signal.connect(receiver, dispatch_uid=f"chamvi_runs.metrics.{receiver.__name__}")


class DatabaseCollector:
    """Gauges read from the database at scrape time; each query is served by an index."""

    def collect(self) -> Iterator[Metric]:
        try:
            counts = Run.objects.order_by().values_list("status").annotate(n=Count("pk"))
            by_status = {status: n for status, n in counts}
            waiting = WaitPoint.objects.filter(decision__isnull=True, run__status=Status.WAITING).count()
            expired = Run.objects.filter(lease_expired()).count()
        except DatabaseError:
            # The process's own metrics are still worth serving.
            logger.warning("metrics: the database could not be read", exc_info=True)
            return
        runs = GaugeMetricFamily("chamvi_runs", "Runs in the database, by status.", labels=["status"])
        for status in Status:
            runs.add_metric([status.value], by_status.get(status.value, 0))
        yield runs
        yield GaugeMetricFamily("chamvi_approvals_waiting", "Open approvals of waiting runs.", value=waiting)
        yield GaugeMetricFamily(
            "chamvi_leases_expired",
            "Running runs whose lease expired, waiting for chamvi_tick to hand them on.",
            value=expired,
        )


def exported() -> CollectorRegistry:
    """What ``metrics_view`` serves: this process's metrics, or with ``PROMETHEUS_MULTIPROC_DIR``
    those of every process writing there, and the database's gauges."""
    registry = CollectorRegistry(auto_describe=False)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        MultiProcessCollector(registry, path=directory)
    else:
        registry.register(REGISTRY)
    registry.register(DatabaseCollector())
    return registry


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics: a bearer ``METRICS_TOKEN``, or a staff session."""
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    token = conf.METRICS_TOKEN
    if token and scheme.lower() == "bearer":
        if hmac.compare_digest(raw.strip().encode(), token.encode()):
            return None
        return _unauthorized("invalid metrics token")
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if user.is_active and user.is_staff:
            return None
        return HttpResponse("metrics are for staff users\n", status=403, content_type="text/plain")
    return _unauthorized("log in as a staff user, or send 'Authorization: Bearer <METRICS_TOKEN>'")


def _unauthorized(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics, in the format the scraper asks for (``Accept``). Mount it in the site's
    URLconf: ``path("metrics", chamvi_runs.metrics.metrics_view)``."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(exported()), content_type=content_type)


_serving: tuple[str, int] | None = None


def serve(port: int, addr: str) -> tuple[str, int] | None:
    """Serve this process's metrics over HTTP on ``addr:port`` (0: a free port), once per process.
    Returns where, or None when the port could not be bound (logged: the worker runs on)."""
    global _serving
    if _serving is None:
        try:
            server, _ = start_http_server(port, addr)
        except OSError as exc:
            logger.error("could not serve metrics on %s:%s (%s): this process exports none", addr, port, exc)
            return None
        _serving = (addr, server.server_port)
        logger.info("serving metrics on http://%s:%d/metrics", *_serving)
    return _serving
