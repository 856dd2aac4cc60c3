"""The database connection of the calling thread, between writes.

An execution holds no transaction while it waits on the model, so its connection sits idle for
seconds. With Django's connection pool (``DATABASES[...]["OPTIONS"]["pool"]``, PostgreSQL) it goes
back to the pool for that wait, which is how a worker executing ``CONCURRENCY`` runs at once needs
far fewer connections than runs. Without a pool the thread keeps its connection: reconnecting per
model call would cost more than it saves.
"""

from __future__ import annotations

from typing import Any

from django.db import connection


def pooled(wrapper: Any = connection) -> bool:
    """Whether ``wrapper`` (a Django connection, the default one unless given) has a pool."""
    return bool(wrapper.settings_dict.get("OPTIONS", {}).get("pool"))


def hand_back() -> None:
    """Return a pooled connection to the pool (no-op without a pool or inside a transaction)."""
    if pooled() and not connection.in_atomic_block:
        connection.close()
