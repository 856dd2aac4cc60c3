"""The database host's servers: a PostgreSQL cluster and a Redis of their own, listening only on the
host's data address (the machine's own servers on 127.0.0.1 are not involved)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.system.multihost.netns import Host

PG_BIN = next(Path("/usr/lib/postgresql").iterdir()) / "bin" if Path("/usr/lib/postgresql").exists() else None


def _as_postgres(*argv: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv]


def start_postgres(host: Host, workdir: Path) -> str:
    """initdb and start a cluster on the host; returns its address. Durability settings are off:
    this cluster lives for one test."""
    if PG_BIN is None or shutil.which("runuser") is None:
        raise RuntimeError("PostgreSQL's server binaries (/usr/lib/postgresql/<v>/bin) are needed")
    data = workdir / "pg"
    data.mkdir()
    shutil.chown(data, "postgres", "postgres")
    data.chmod(0o700)
    subprocess.run(
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    address = host.addresses["data"]
    subnet = address.rsplit(".", 1)[0] + ".0/24"
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {subnet} trust\n")
    host.start(
        _as_postgres(
            str(PG_BIN / "postgres"),
            "-D",
            str(data),
            "-c",
            f"listen_addresses={address}",
            "-c",
            "port=5432",
            "-c",
            f"unix_socket_directories={data}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=100",
        ),
        log=workdir / "postgres.log",
    )
    _wait_until(
        lambda: _answers(str(PG_BIN / "pg_isready"), "-q", "-h", address), 60, workdir / "postgres.log"
    )
    return address


def start_redis(host: Host, workdir: Path) -> str:
    address = host.addresses["data"]
    host.start(
        [
            "redis-server",
            "--bind",
            address,
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            str(workdir),
        ],
        log=workdir / "redis.log",
    )
    _wait_until(lambda: _answers("redis-cli", "-h", address, "ping"), 30, workdir / "redis.log")
    return address


def _answers(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0


def _wait_until(ready: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
