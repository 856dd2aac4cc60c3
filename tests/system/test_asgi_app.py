"""``chamvi_runs.asgi.get_asgi_application()``: the one ASGI line a site needs. Under daphne the admin
is styled in DEBUG, and in embedded mode the executor starts in the serving process, never in
``manage.py`` commands that only run the system checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


async def _get(application, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        message = await communicator.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(10)
    return start["status"], dict(start["headers"]), body


def test_admin_stylesheet_is_served_under_asgi_in_debug(settings):
    # Under `python -m daphne` nothing served /static/: the admin and its login page were unstyled.
    from chamvi_runs.asgi import get_asgi_application

    settings.DEBUG = True
    status, headers, body = async_to_sync(_get)(get_asgi_application(), "/static/admin/css/base.css")
    assert status == 200
    assert headers[b"Content-Type"].startswith(b"text/css")
    assert b"#header" in body


def test_no_static_files_without_debug(settings):
    # A deployment serves STATIC_ROOT itself (collectstatic + its proxy or WhiteNoise).
    from chamvi_runs.asgi import get_asgi_application

    settings.DEBUG = False
    status, _, _ = async_to_sync(_get)(get_asgi_application(), "/static/admin/css/base.css")
    assert status == 404


@pytest.mark.parametrize(
    "application", ["project.asgi.application", "tests.testapp.asgi_with_start_embedded.application"]
)
def test_embedded_executor_starts_in_the_serving_process_not_in_checks(tmp_path, application):
    # runserver runs the checks (which import the application) and then serves it in one process;
    # manage.py migrate runs the same checks and must execute nothing. The same for a site's own
    # router that calls start_embedded().
    script = textwrap.dedent(
        """
        import asyncio, threading
        import django
        django.setup()
        from django.conf import settings
        settings.ASGI_APPLICATION = "{application}"
        from django.core.management import call_command
        call_command("migrate", verbosity=0)
        call_command("check", fail_level="WARNING")
        names = lambda: {t.name for t in threading.enumerate()}
        print("after checks:", sorted(n for n in names() if n.startswith("chamvi")))
        from django.utils.module_loading import import_string
        application = import_string(settings.ASGI_APPLICATION)
        from tests.system.test_asgi_app import _get
        status, _, _ = asyncio.run(_get(application, "/"))
        print("after first request:", status, sorted(n for n in names() if n.startswith("chamvi-janitor")))
        """
    ).replace("{application}", application)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY")}
    env.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert "after checks: []" in done.stdout, done.stdout
    assert "after first request: 200 ['chamvi-janitor']" in done.stdout, done.stdout
