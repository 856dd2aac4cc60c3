"""The headless-browser suite: Debian's Chromium, driven by Playwright, against a real daphne serving
project.asgi with the test database, one real ``manage.py rqworker chamvi``, channels-redis on the test
Redis and the scripted model server.

One browser, web process and worker for the browser suite (this package), started once: each costs
seconds to start, and the tests share nothing else (a user, its runs and Redis are made per test). They
stop when the package is done: a worker left running for the whole session would take the jobs of the
other modules' tests, which execute their runs in-process.

``CHAMVI_SCREENSHOTS=<dir>`` saves named PNGs of the pages along the way (``make screenshots``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import PASSWORD, make_superuser
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import ScriptedServer

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling Google on this closed network and
# misbehaves (stalls, crashes); QUIC and the GPU are of no use headless either.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The model the demo's "support" agent calls in the worker (settings.CHAMVI_MODEL): the scripts of
# these tests are queued under it.
SUPPORT_MODEL = "m-support"
ALLOW_ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"
# Every expect() and every action waits at most this long: generous for a loaded CI machine, short
# enough that a broken page fails well inside the test's timeout.
WAIT_MS = 15_000
# Records every WebSocket the page opens, so a test can drop the run page's socket mid-run, and the type
# of every event they brought, so a test knows when the page has caught up with the run; and every
# Content-Security-Policy violation, so a page that needs more than the bundled project's strict
# policy (project/csp.py) fails its test.
TRACK_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.__events = [];
  window.__violations = [];
  document.addEventListener("securitypolicyviolation", (e) =>
    window.__violations.push(e.violatedDirective + " " + e.blockedURI));
  window.WebSocket = function (...args) {
    const socket = new Native(...args);
    window.__sockets.push(socket);
    socket.addEventListener("message", (m) => window.__events.push(JSON.parse(m.data).type));
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
})();
"""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "violates_csp: the test breaks the policy on purpose; not checked")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Chromium; skipped outside CI when it is not installed, a failure in CI.

    Playwright's sync API keeps an event loop running in this thread, which makes Django refuse
    ORM calls here (SynchronousOnlyOperation); the tests call the ORM only between browser calls,
    never concurrently, so Django's guard is lifted while the browser is open, and only then."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            missing = "the playwright package is not installed (pip install -e '.[dev]')"
    if missing:
        if in_ci():
            pytest.fail(f"the browser suite must run in CI: {missing}", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOW_ASYNC_UNSAFE, "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


@dataclass
class LiveSite:
    web: WebProcess
    worker: WorkerProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web.port}"

    def logs(self) -> str:
        return f"--- web ---\n{self.web.output()[-3000:]}\n--- worker ---\n{self.worker.output()[-3000:]}"


@pytest.fixture(scope="package")
def live_site(
    browser: Any, model_server: ScriptedServer, django_db_setup: None, django_db_blocker: Any
) -> Iterator[LiveSite]:
    from tests.conftest import _wipe_redis

    with django_db_blocker.unblock():
        _wipe_redis()
        env = worker_env(model_server.base_url, CHAMVI_MODEL=SUPPORT_MODEL)
        env.pop(ALLOW_ASYNC_UNSAFE)  # the servers keep Django's guard
        web = WebProcess(env)
        worker = WorkerProcess(env)
        try:
            site = LiveSite(web, worker)
            wait_for(worker.ready, 60, worker.output)
            yield site
        finally:
            # A test may have put a worker of its own in the site's place.
            try:
                worker.stop()
                if site.worker is not worker:
                    site.worker.stop()
            finally:
                web.stop()


@pytest.fixture(autouse=True)
def _clean_redis() -> None:
    """Overrides the suite's wipe before and after every test: it would delete the live worker's own
    registration. The live site wipes once, before its worker starts; run ids never repeat."""


@pytest.fixture(autouse=True)
def _settle_runs(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that failed half-way leaves no run executing into the next test's flushed tables."""
    yield
    if "live_site" not in request.fixturenames:
        return
    from chamvi_runs import cancel_run
    from chamvi_runs.core.states import TERMINAL
    from chamvi_runs.models import Run

    active = list(Run.objects.exclude(status__in=TERMINAL).values_list("pk", flat=True))
    for run_id in active:
        cancel_run(run_id)
    wait_for(lambda: not Run.objects.exclude(status__in=TERMINAL).exists(), 30, "the test's runs to settle")


@pytest.fixture
def user(live_site: LiveSite) -> Any:
    return make_superuser("alice")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def failure_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser-failures")


def csp_violations(tab: Any) -> list[str]:
    """The violations the page's current document has recorded: none from a closed page or one in
    the middle of a navigation (its new document records its own)."""
    from playwright.sync_api import Error

    if tab.is_closed():
        return []
    try:
        return tab.evaluate("window.__violations || []")
    except Error:
        return []


@pytest.fixture
def page(
    browser: Any, live_site: LiveSite, user: Any, request: pytest.FixtureRequest, failure_dir: Path
) -> Iterator[Any]:
    """A page logged in as ``user`` through the admin's login form; on failure a screenshot, the
    page's console and the servers' logs are kept."""
    from playwright.sync_api import expect

    context = browser.new_context(base_url=live_site.url, viewport={"width": 1000, "height": 760})
    context.add_init_script(TRACK_SOCKETS)
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    console: list[str] = []
    tab.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    tab.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
    tab.goto("/admin/login/?next=/")
    tab.fill("#id_username", user.username)
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    expect(tab).to_have_url(live_site.url + "/")
    yield tab
    report = getattr(request.node, "report_call", None)
    # Read before the context closes; asserted after, so a violation leaves no context open. The
    # console tells those of every document the test went through (the admin's login included).
    refused = [line for line in console if "Content Security Policy" in line]
    checked = report is not None and report.passed and not request.node.get_closest_marker("violates_csp")
    violations = refused + csp_violations(tab) if checked else []
    url = tab.url
    if report is not None and report.failed:
        shot = failure_dir / (re.sub(r"[^\w.-]+", "_", request.node.name) + ".png")
        try:
            tab.screenshot(path=str(shot), full_page=True)
        except Exception as exc:  # the page may be what broke; the report still matters
            shot = Path(f"(no screenshot: {exc})")
        report.sections.append(
            ("browser", f"screenshot: {shot}\nurl: {tab.url}\nconsole:\n" + "\n".join(console))
        )
        report.sections.append(("servers", live_site.logs()))
    context.close()
    assert violations == [], f"Content-Security-Policy violations on {url}"


@pytest.fixture
def shoot(page: Any) -> Callable[..., None]:
    """``shoot(name)`` saves the page's viewport (or the whole page) as <name>.png when
    CHAMVI_SCREENSHOTS names a directory."""
    target = os.environ.get("CHAMVI_SCREENSHOTS")

    def save(name: str, full_page: bool = False) -> None:
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=full_page)

    return save
