"""What a process has spent, from /proc: the CPU of a worker, a driver or a PostgreSQL backend, the
resident memory of a worker, the CPU of the whole machine."""

from __future__ import annotations

import os
from pathlib import Path

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


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])
