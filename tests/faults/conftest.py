from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.faults.harness import FaultyModel, WorkerPool, install_audit

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


@pytest.fixture
def pool(server) -> Iterator[WorkerPool]:
    workers = WorkerPool(server)
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
