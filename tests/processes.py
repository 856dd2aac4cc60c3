"""Real worker processes for tests: ``manage.py rqworker chamvi`` against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def worker_env(model_base_url: str, **extra: str) -> dict[str, str]:
    db = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        OPENAI_BASE_URL=model_base_url,
        OPENAI_API_KEY="test",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


class WorkerProcess:
    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="chamvi-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", "chamvi", *args],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)


def wait_for(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> object:
    """Poll ``predicate``; ``what`` (or what it returns, e.g. a worker's log) explains a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what() if callable(what) else what}"
            )
        time.sleep(0.05)
