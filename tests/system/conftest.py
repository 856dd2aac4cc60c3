"""The system tier: tests that start processes (RQ workers they may kill, daphne, Chromium, Node,
PostgreSQL clusters of their own, fresh sites) and load. Every test here is marked ``system``
(``pytest -m system``; ``-m "not system"`` runs the rest, quicker)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import WorkerProcess, worker_env

HERE = Path(__file__).parent


# tryfirst: the mark is set before pytest's own hook deselects by -m.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every item of the session: only those under this directory.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.system)


@pytest.fixture
def spawn(server: Any) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn(*args, env=...)`` starts a ``manage.py rqworker chamvi`` process against the scripted
    model server (``args`` go to rqworker, ``env`` adds to its environment); every one is stopped
    after the test."""
    workers: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(worker_env(server.base_url, **(env or {})), *args)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
