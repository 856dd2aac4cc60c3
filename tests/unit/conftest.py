"""The unit tier: tests of pure code that need no server, so `make check` runs them in seconds on
any machine, PostgreSQL and Redis down or not.

Every test under tests/unit is marked ``unit`` here (``pytest -m unit``, ``-m "not unit"``), so no
test needs decorating. A test here that asks for the database, Redis or the scripted model server
stops the collection: it belongs beside the tests that start those servers, not in this tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
# What reaches a server: pytest-django's database (through these fixtures or the django_db mark) and
# the fixtures of tests/conftest.py for Redis, the RQ queue and the scripted model server.
SERVER_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_setup", "live_server", "redis", "queue", "model_server", "server"}
)


def _servers_wanted(item: pytest.Item) -> set[str]:
    wanted = {name for name in getattr(item, "fixturenames", ()) if name in SERVER_FIXTURES}
    if item.get_closest_marker("django_db"):
        wanted.add("mark django_db")
    return wanted


# tryfirst: the mark is set before pytest's own hook deselects by -m.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every item of the session: only those under this directory.
    refused = []
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.unit)
        if wanted := _servers_wanted(item):
            refused.append(f"{item.nodeid} wants {', '.join(sorted(wanted))}")
    if refused:
        raise pytest.UsageError(
            "tests/unit is for tests that need no server; move these beside the tests that start one:\n  "
            + "\n  ".join(refused)
        )
