from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.system.faults.harness import FaultyModel, WorkerPool, install_audit

# CI runs the default sizes; `make soak` raises them.
SCALE = int(os.environ.get("CHAMVI_FAULT_SCALE", "1"))


@pytest.fixture
def audit(transactional_db) -> None:
    install_audit()


@pytest.fixture
def model(server, audit) -> Iterator[FaultyModel]:
    faulty = FaultyModel(server)
    faulty.install()
    yield faulty


# Runs one worker process executes at once in the concurrent variants (CHAMVI_CONCURRENCY).
CONCURRENT = 4

# The same scenario, and the same checker, with workers of one run and of CONCURRENT runs at once.
each_concurrency = pytest.mark.parametrize(
    "concurrency", [1, CONCURRENT], ids=["serial", f"concurrency{CONCURRENT}"]
)


@pytest.fixture
def concurrency() -> int:
    """Runs per worker process; a test overrides it with ``each_concurrency`` or a parametrize."""
    return 1


@pytest.fixture
def pool(server, concurrency) -> Iterator[WorkerPool]:
    workers = WorkerPool(server, concurrency=concurrency)
    yield workers
    workers.stop()


_RECORDS: list[tuple[str, dict]] = []


@pytest.fixture
def record():
    """Remember a scenario's counts for the summary printed at the end of the session."""

    def remember(scenario: str, report, **extra) -> None:
        _RECORDS.append((scenario, {**vars(report), **extra}))

    return remember


def pytest_terminal_summary(terminalreporter) -> None:
    if not _RECORDS:
        return
    terminalreporter.section("fault injection: what was injected and what the checker counted")
    for scenario, counts in _RECORDS:
        terminalreporter.write_line(f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
