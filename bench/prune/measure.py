"""What the bench measures: the tables' rows and sizes, the prune command's own figures read back
from what it printed, and a scrape of the metrics view."""

from __future__ import annotations

import io
import re
import time
from typing import Any

TABLES = ("run", "step", "checkpoint", "waitpoint", "runinput", "effectrecord", "thread", "artifact")
LIVE = ("queued", "running", "waiting", "interrupted")


def history_size() -> tuple[float, float]:
    """A checkpoint's history on average, in KiB: as JSON text, and as stored (compressed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT avg(length(messages::text)), avg(pg_column_size(messages)) FROM chamvi_runs_checkpoint"
        )
        text, stored = cursor.fetchone()
        return float(text) / 1024, float(stored) / 1024


def sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
            [[f"chamvi_runs_{t}" for t in TABLES]],
        )
        return {name.removeprefix("chamvi_runs_"): size for name, size in cursor.fetchall()}


def vacuum(full: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM {'FULL ' if full else ''}ANALYZE chamvi_runs_{table}")


def counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM chamvi_runs_{t}" for t in TABLES))
        return dict(cursor.fetchall())


def live_runs() -> dict[str, int]:
    from django.db.models import Count

    from chamvi_runs.models import Run

    counted = Run.objects.filter(status__in=LIVE).values("status").annotate(n=Count("pk"))
    return {row["status"]: row["n"] for row in counted}


def prune(*args: str) -> tuple[str, float]:
    from django.core.management import call_command

    out = io.StringIO()
    started = time.monotonic()
    call_command("chamvi_prune", *args, stdout=out)
    return out.getvalue(), time.monotonic() - started


def figures(output: str) -> dict[str, Any]:
    """The command's table and timings, read back from what it printed."""
    table = {}
    for line in output.splitlines():
        match = re.fullmatch(r"(\w+(?: files)?)\s+([\d,]+)\s+([\d,]+)", line)
        if match:
            table[match[1]] = (int(match[2].replace(",", "")), int(match[3].replace(",", "")))
    timing = re.search(r"(\d+) batches of at most \d+; longest ([\d.]+) s; elapsed ([\d.]+) s", output)
    assert timing, output
    return {
        "table": table,
        "batches": int(timing[1]),
        "longest": float(timing[2]),
        "elapsed": float(timing[3]),
    }


def scrape(times: int = 20) -> tuple[float, int, dict[str, float]]:
    """The metrics view, as Prometheus scrapes it (a bearer token): median ms per scrape, the
    response's bytes, and the database gauges it served."""
    from django.test import Client
    from django.test.utils import override_settings

    from project.settings import CHAMVI_RUNS

    token = "bench-scrape"
    with override_settings(ALLOWED_HOSTS=["testserver"], CHAMVI_RUNS={**CHAMVI_RUNS, "METRICS_TOKEN": token}):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        timings, body = [], b""
        for _ in range(times):
            started = time.perf_counter()
            response = client.get("/metrics")
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.status_code
            body = response.content
    gauges = {}
    for line in body.decode().splitlines():
        if line.startswith(("chamvi_runs{", "chamvi_approvals_waiting ", "chamvi_leases_expired ")):
            name, value = line.rsplit(" ", 1)
            gauges[name] = float(value)
    return sorted(timings)[len(timings) // 2], len(body), gauges
