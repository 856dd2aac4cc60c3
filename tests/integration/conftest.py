"""The integration tier: tests against the real PostgreSQL and Redis, in this process (the engine
in-process, websockets through the Channels communicator, SSE through the test client), with the
scripted model server. Every test here is marked ``integration`` (``pytest -m integration``)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


# tryfirst: the mark is set before pytest's own hook deselects by -m.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every item of the session: only those under this directory.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)
