"""The README, followed into a brand-new ``django-admin startproject`` site: every snippet is taken
from README.md itself, pasted where the README says, and the site must check clean, serve, stream a
run over the websocket, wait for approval and complete once approved over HTTP."""

from __future__ import annotations

import asyncio
import html
import http.cookiejar
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import pytest

from tests.conftest import require
from tests.docsamples import block, shell_commands
from tests.docsamples.site import check_clean, command_args, create_site, run, site_env
from tests.support.ws_client import Socket

PASSWORD = "fresh-site-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Cookies and CSRF as a browser keeps them, over plain HTTP."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, str]:
        with self.opener.open(self.base + path, timeout=20) as response:
            return response.status, response.read().decode()

    def post_form(self, path: str, fields: dict[str, str]) -> tuple[int, str]:
        _, page = self.get(path)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, f"no CSRF field on {path}"
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), **fields}).encode()
        request = urllib.request.Request(self.base + path, data=data, headers={"Referer": self.base + path})
        with self.opener.open(request, timeout=20) as response:
            return response.status, response.read().decode()

    def cookie(self, name: str) -> str:
        return next(c.value for c in self.jar if c.name == name)


def _serve(cwd: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """The README's serve commands: migrate, a superuser (non-interactive here), daphne."""
    daphne = None
    for command in shell_commands("readme-serve"):
        args = command_args(command)
        if args[-1] == "createsuperuser":
            superuser = {"DJANGO_SUPERUSER_USERNAME": "admin", "DJANGO_SUPERUSER_PASSWORD": PASSWORD}
            superuser["DJANGO_SUPERUSER_EMAIL"] = "admin@example.com"
            run([*args, "--noinput"], cwd, {**env, **superuser})
        elif args[0].endswith("daphne"):
            check_clean(cwd, env)  # first: the README's site has no error and no warning at all
            daphne = subprocess.Popen(
                [args[0], "-b", "127.0.0.1", "-p", str(port), *args[1:]],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        else:
            run(args, cwd, env)
    assert daphne is not None, "the README's serve commands start no daphne"
    return daphne


def _first_page(browser: Browser, daphne: subprocess.Popen[bytes], deadline: float) -> None:
    while True:
        try:
            status, _ = browser.get("/admin/login/")
            assert status == 200
            return
        except OSError:
            if daphne.poll() is not None or time.monotonic() > deadline:
                output = daphne.stdout.read().decode() if daphne.stdout else ""
                raise AssertionError(f"daphne serves nothing:\n{output}") from None
            time.sleep(0.2)


def _add_chat_page(cwd: Path) -> None:
    """docs/chat-client.md's chat page: its settings, its urls.py, its template and its script,
    each where that page says."""
    settings = cwd / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + block("chat-page-settings"))
    (cwd / "mysite" / "urls.py").write_text(block("chat-page-url"))
    for sample, path in (
        ("chat-page-html", "templates/example/chat.html"),
        ("chat-page-js", "static/example/chat.js"),
    ):
        (cwd / path).parent.mkdir(parents=True, exist_ok=True)
        (cwd / path).write_text(block(sample))


def _open_chat_page(browser: Browser) -> None:
    status, page = browser.get("/example/chat/")
    assert status == 200 and 'data-api="/chamvi/api/runs/"' in page and "csrfmiddlewaretoken" in page
    scripts = re.findall(r'<script type="module" src="([^"]+)"', page)
    assert scripts == ["/static/example/chat.js"], scripts
    status, script = browser.get(scripts[0])
    assert status == 200 and 'from "../chamvi_runs/client.js"' in script
    status, client = browser.get("/static/chamvi_runs/client.js")  # what the script imports
    assert status == 200 and "export function connectThread" in client


def _curl(commands: list[str], port: int, env: dict[str, str]) -> dict:
    """A README curl sample, against this site's port, with the variables it names set in ``env``."""
    (command,) = commands
    command = command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(120)
def test_readme_site_from_startproject_to_an_approved_run(tmp_path: Path) -> None:
    env = site_env()
    started = time.monotonic()
    cwd = create_site(tmp_path, env)
    _add_chat_page(cwd)
    port = _free_port()
    daphne = _serve(cwd, env, port)
    try:
        browser = Browser(port)
        _first_page(browser, daphne, started + 90)
        print(f"startproject to the first page served: {time.monotonic() - started:.1f} s")

        # Under daphne with DEBUG, the admin's static files are served (a styled admin).
        status, css = browser.get("/static/admin/css/base.css")
        assert status == 200 and "body" in css

        browser.post_form("/admin/login/?next=/admin/", {"username": "admin", "password": PASSWORD})
        _open_chat_page(browser)
        _, page = browser.post_form("/admin/chamvi_runs/apitoken/add/", {"name": "cli", "user": "1"})
        token = re.search(r"not shown again: (chv_[\w-]+)", html.unescape(page))
        assert token, "the admin showed no new API token"
        curl_env = {**env, "TOKEN": token.group(1)}

        run = _curl(shell_commands("readme-curl-start"), port, curl_env)
        assert run["agent"] == "support" and run["status"] == "queued", run
        asyncio.run(_watch_and_approve(port, browser.cookie("sessionid"), run["id"], curl_env))
    finally:
        daphne.terminate()
        daphne.wait(10)


async def _watch_and_approve(port: int, session: str, run_id: str, env: dict[str, str]) -> None:
    ws = await Socket.open(port, f"/ws/chamvi/runs/{run_id}/?after=0", f"sessionid={session}")
    try:
        before = await ws.until("run.waiting", timeout=30)
        text = "".join(e["text"] for e in before if e["type"] == "delta" and e["kind"] == "text")
        assert "Let me look that order up." in text
        assert [e["name"] for e in before if e["type"] == "tool.result"] == ["lookup_order"]
        waiting = before[-1]
        assert waiting["tool_name"] == "issue_refund"
        assert waiting["input"] == {"order_id": "A-1001", "amount_cents": 4599}

        decided = await asyncio.to_thread(
            _curl, shell_commands("readme-curl-approve"), port, {**env, "APPROVAL_ID": waiting["approval_id"]}
        )
        assert decided["decision"] == "approved", decided

        after = await ws.until("run.end", timeout=30)
        refunds = [e for e in after if e["type"] == "tool.result" and e["name"] == "issue_refund"]
        assert refunds and refunds[0]["output"]["amount_cents"] == 4599
        end = after[-1]
        assert end["status"] == "completed", end
        assert end["output"].startswith("Done:")
        seqs = [e["seq"] for e in before + after]
        assert seqs == list(range(1, len(seqs) + 1))
    finally:
        await ws.close()


# A site that is not brand new: its database comes from the environment, on PostgreSQL, with
# OPTIONS of its own. The README's settings must leave both alone (transaction_mode is SQLite's).
OWN_DATABASE = """
import os

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["SITE_DB_NAME"],
        "USER": os.environ["SITE_DB_USER"],
        "HOST": os.environ["SITE_DB_HOST"],
        "PORT": os.environ["SITE_DB_PORT"],
        "OPTIONS": {"connect_timeout": 5},
    }
}
"""

EXECUTE_A_RUN = """
import time
from django.conf import settings
from chamvi_runs import start_run
print(settings.DATABASES["default"]["OPTIONS"])
run = start_run("support", {"message": "Order A-1001 arrived broken."})
deadline = time.monotonic() + 30
while run.status != "waiting" and time.monotonic() < deadline:
    time.sleep(0.05)
    run.refresh_from_db()
print(run.status)
"""


@pytest.mark.timeout(120)
def test_readme_settings_on_a_postgresql_site_keep_its_database_options(tmp_path: Path) -> None:
    require("DATABASE_URL")
    server = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    name = f"{server.path.lstrip('/')}_fresh_pg"
    admin_url = urllib.parse.urlunsplit((server.scheme, server.netloc, "/postgres", "", ""))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {
            **site_env(),
            "SITE_DB_NAME": name,
            "SITE_DB_USER": server.username or "postgres",
            "SITE_DB_HOST": server.hostname or "127.0.0.1",
            "SITE_DB_PORT": str(server.port or 5432),
        }
        cwd = create_site(tmp_path, env)
        settings = cwd / "mysite" / "settings.py"
        snippet = block("readme-settings-embedded")
        settings.write_text(settings.read_text().replace(snippet, OWN_DATABASE + "\n" + snippet))
        check_clean(cwd, env)
        run([sys.executable, "manage.py", "migrate", "--no-input"], cwd, env)
        executed = run([sys.executable, "manage.py", "shell", "-c", EXECUTE_A_RUN], cwd, env)
        # The site's OPTIONS as they were, and the embedded executor claims and runs on PostgreSQL.
        assert executed.stdout.splitlines()[-2:] == ["{'connect_timeout': 5}", "waiting"], executed.stdout
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
