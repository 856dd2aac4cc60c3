"""PostgreSQL connections a daphne web process holds after N page loads, per connection setting.

A real ``daphne project.asgi:application`` (the bundled project, DEBUG off, the ``rq`` executor so
that no executor thread holds a connection of its own) serves a logged-in superuser N page loads
(the admin index, the run changelist, the approvals page, the user changelist, in turn, one at a time);
pg_stat_activity is read for the backends named ``chamvi-bench-web`` after each load (the most
seen) and after the last one (held). Each setting gets a daphne of its own:

- ``persistent``: ``CONN_MAX_AGE = 500`` (dj_database_url's default in many sites);
- ``per-request``: ``CONN_MAX_AGE = 0`` (what chamvi_runs asks of web processes);
- ``pool``: ``CONN_MAX_AGE = 0`` with Django's psycopg pool (``OPTIONS={"pool": ...}``, max 4).

    .venv/bin/python bench/conn_leak.py                 # 240 loads, every setting
    .venv/bin/python bench/conn_leak.py --loads 60 --settings persistent,pool --json

Uses the server of DATABASE_URL (database ``chamvi_bench_connleak``, recreated) and REDIS_URL.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
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
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pgstats import Server, dsn  # noqa: E402

APP_NAME = "chamvi-bench-web"
SETTINGS = {
    "persistent": {"CHAMVI_BENCH_CONN_MAX_AGE": "500"},
    "per-request": {"CHAMVI_BENCH_CONN_MAX_AGE": "0"},
    "pool": {"CHAMVI_BENCH_CONN_MAX_AGE": "0", "CHAMVI_BENCH_POOL": "4"},
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
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.conn_leak_settings",
        "DJANGO_SECRET_KEY": "chamvi-bench-conn-leak",
        "DATABASE_URL": dsn(database),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
        "PYTHONPATH": str(ROOT),
        **SETTINGS[setting],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=240)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"some of {','.join(SETTINGS)}")
    parser.add_argument("--database", default="chamvi_bench_connleak")
    parser.add_argument("--json", action="store_true", help="one JSON line per setting")
    args = parser.parse_args()
    server = Server()
    prepare(server, args.database)
    try:
        results = [measure(server, args.database, s, args.loads) for s in args.settings.split(",")]
    finally:
        server.admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    if args.json:
        for result in results:
            print(json.dumps(asdict(result)))
        return
    print(f"PostgreSQL {server.version()}; backends of one daphne after {args.loads} page loads, logged in")
    print("| setting | held after the loads | of which idle | most seen |")
    print("| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r.setting} | {r.held} | {r.idle} | {r.peak} |")


if __name__ == "__main__":
    main()
