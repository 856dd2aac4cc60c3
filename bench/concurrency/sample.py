"""What the workers cost while they run: RSS and CPU from /proc, their PostgreSQL connections from
pg_stat_activity, sampled by a thread of the driver every ``interval`` seconds."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psycopg

from bench.common.procstat import rss_kib

from .resources import APP_NAME, admin


def connections(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
    ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Peaks:
    rss_kib: dict[int, int] = field(default_factory=dict)
    connections: int = 0
    samples: int = 0


class Sampler:
    """Peaks of each worker's RSS and of the workers' connections, from ``start()`` to ``stop()``."""

    def __init__(self, pids: list[int], interval: float = 0.5) -> None:
        self.pids = pids
        self.interval = interval
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._conn = admin()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> None:
        for pid in self.pids:
            rss = rss_kib(pid)
            if rss is not None:
                self.peaks.rss_kib[pid] = max(self.peaks.rss_kib.get(pid, 0), rss)
        self.peaks.connections = max(self.peaks.connections, connections(self._conn))
        self.peaks.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> Peaks:
        self._stop.set()
        self._thread.join()
        self.sample()
        self._conn.close()
        return self.peaks
