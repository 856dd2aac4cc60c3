"""CPU time of a process, from /proc: what a worker, a driver or a PostgreSQL backend has spent."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float | None:
    """User + system CPU of ``pid`` (all its threads) in milliseconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / _TICKS


def cpu_ms_of(pids: list[int]) -> dict[int, float]:
    """``cpu_ms`` of each of ``pids`` still alive."""
    return {pid: value for pid in pids if (value := cpu_ms(pid)) is not None}
