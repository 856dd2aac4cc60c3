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

ROOT = Path(__file__).resolve().parents[2]


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

    def ready(self) -> bool:
        """Listening on its queue, with its signal handlers installed."""
        return "Listening on" in self.output()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)  # stopped once already: nothing to remove

    def stop_gracefully(self, timeout: float = 30) -> int:
        """Stop it as a deploy does: SIGTERM, then wait for it to drain and exit. Returns its exit
        code; raises ``subprocess.TimeoutExpired`` (the process left running, for ``stop``) when it
        takes longer than ``timeout``. Its log stays readable until ``stop``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


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


def answers(url: str) -> bool:
    """An HTTP server answers at ``url``, whatever its status."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


class WebProcess:
    """``daphne project.asgi:application`` on a free port, against the test database."""

    def __init__(self, env: dict[str, str]) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log = tempfile.NamedTemporaryFile(prefix="chamvi-web-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "project.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._up, 30, self.output)

    def _up(self) -> bool:
        return answers(f"http://127.0.0.1:{self.port}/")

    def request(self, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
        import json
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        os.unlink(self.log.name)
