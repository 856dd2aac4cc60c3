"""Page loads against one daphne per connection setting, and the PostgreSQL connections they leave
(the measure of bench.conn_leak, whose __main__ prints it)."""

from __future__ import annotations

import http.cookiejar
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from bench.common import ROOT
from bench.common.pgstats import Server, dsn

APP_NAME = "chamvi-bench-web"
# Each setting: CHAMVI_BENCH_CONN_MAX_AGE (bench/common/settings.py) and options of DATABASE_URL
# (the project's ``?pool=N``: Django's psycopg pool of at most N connections, at least 1).
SETTINGS = {
    "persistent": ({"CHAMVI_BENCH_CONN_MAX_AGE": "500"}, ""),
    "per-request": ({"CHAMVI_BENCH_CONN_MAX_AGE": "0"}, ""),
    "pool": ({"CHAMVI_BENCH_CONN_MAX_AGE": "0"}, "&pool=4"),
}
PAGES = ["/admin/", "/admin/chamvi_runs/run/", "/chamvi/approvals/", "/admin/auth/user/"]


@dataclass
class Result:
    setting: str
    loads: int
    peak: int  # the most backends of the web process seen after any load
    held: int  # backends of the web process after the last load
    idle: int  # of which idle (a connection nothing will use again, unless pooled)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(database: str, setting: str) -> dict[str, str]:
    variables, options = SETTINGS[setting]
    url = dsn(database)
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.common.settings",
        "DJANGO_SECRET_KEY": "chamvi-bench-conn-leak",
        "DATABASE_URL": f"{url}{'&' if '?' in url else '?'}application_name={APP_NAME}{options}",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
        "PYTHONPATH": str(ROOT),
        **variables,
    }


def prepare(server: Server, database: str) -> None:
    """A new database with the migrations and the demo superuser (demo / demo)."""
    server.recreate(database)
    env = environment(database, "per-request")
    command = [sys.executable, "manage.py", "chamvi_demo_user", "--migrate"]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)


class Browser:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=20) as response:
            return response.read().decode()

    def log_in(self) -> None:
        page = self.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, "no CSRF field on the login page"
        fields = {
            "csrfmiddlewaretoken": token.group(1),
            "username": "demo",
            "password": "demo",
            "next": "/admin/",
        }
        request = urllib.request.Request(
            self.base + "/admin/login/",
            data=urllib.parse.urlencode(fields).encode(),
            headers={"Referer": self.base + "/admin/login/"},
        )
        with self.opener.open(request, timeout=20) as response:
            assert "Log out" in response.read().decode(), "the demo user could not log in"


def backends(server: Server, database: str) -> tuple[int, int]:
    """(all, idle) backends of ``database`` opened by the web process."""
    rows = server.admin.execute(
        "SELECT state FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        [database, APP_NAME],
    ).fetchall()
    return len(rows), sum(1 for (state,) in rows if state == "idle")


def measure(server: Server, database: str, setting: str, loads: int) -> Result:
    port = _free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the finally below, after daphne)
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "project.asgi:application"],
        cwd=ROOT,
        env=environment(database, setting),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        browser = Browser(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                browser.log_in()
                break
            except OSError:
                if daphne.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"daphne did not answer:\n{log.read().decode()}") from None
                time.sleep(0.1)
        peak = 0
        for n in range(loads):
            try:
                browser.get(PAGES[n % len(PAGES)])
            except urllib.error.HTTPError as exc:
                # "too many clients": the server's max_connections ran out (what the bench is about).
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"load {n + 1} ({setting}) answered {exc.code}:\n{tail}") from None
            peak = max(peak, backends(server, database)[0])
        held, idle = backends(server, database)
        return Result(setting, loads, max(peak, held), held, idle)
    finally:
        daphne.terminate()
        daphne.wait(15)
        log.close()
        server.wait_for_no_backends(database)
