"""What a user does in the browser, as helpers the browser tests share, and the scripts of the demo's
"support" agent (tools lookup_order and issue_refund; issue_refund needs an approval)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from chamvi_runs.models import Run
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, ScriptedServer, finish, text, tool_call
from tests.system.browser.conftest import SUPPORT_MODEL, WAIT_MS, in_ci

try:
    from playwright.sync_api import expect
except ImportError:
    if in_ci():
        raise
    pytest.skip("the playwright package is not installed (pip install -e '.[dev]')", allow_module_level=True)

__all__ = ["expect"]

REFUND_INPUT = {"order_id": "A-1001", "amount_cents": 4599}
RUN_PATH = re.compile(r"/chamvi/runs/([^/]+)/$")


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2)


def script(server: ScriptedServer, *replies: Reply) -> None:
    server.script(SUPPORT_MODEL, list(replies))


def script_refund(server: ScriptedServer, *after_decision: Reply) -> None:
    """The model asks for the refund (an approval), then answers with ``after_decision``."""
    script(
        server,
        Reply(
            text("Let me refund that."),
            tool_call("c1", "issue_refund", json.dumps(REFUND_INPUT)),
            finish("tool_calls"),
        ),
        *after_decision,
    )


def start_from_home(page: Any, message: str) -> str:
    """The demo home page's start form (agent "support"); it goes on to the run page."""
    page.goto("/")
    page.fill("#text", message)
    page.click("#start button")
    page.wait_for_url(RUN_PATH)
    match = RUN_PATH.search(page.url)
    assert match, page.url
    return match.group(1)


def post_run(page: Any, body: dict[str, Any]) -> str:
    """``POST /chamvi/api/runs/`` from the open page, with its session and CSRF token; the run's id."""
    status, run = page.evaluate(
        """async (body) => {
          const csrf = document.cookie.split("; ").find(c => c.startsWith("csrftoken="))?.split("=")[1];
          const r = await fetch("/chamvi/api/runs/", {method: "POST", body: JSON.stringify(body),
            headers: {"Content-Type": "application/json", "X-CSRFToken": csrf}});
          return [r.status, await r.json()];
        }""",
        body,
    )
    assert status == 201, run
    return run["id"]


def start_via_api(page: Any, body: dict[str, Any]) -> str:
    """``post_run``, as the home page's script does (the home page sends no thread); then opens the
    run page."""
    run_id = post_run(page, body)
    page.goto(f"/chamvi/runs/{run_id}/")
    return run_id


def caught_up_to(page: Any, event_type: str) -> None:
    """The page's sockets have brought an event of ``event_type`` (live or replayed) and the page has
    handled it: its own listener runs in the same task as the recorder of TRACK_SOCKETS."""
    page.wait_for_function("(type) => window.__events.includes(type)", arg=event_type, timeout=WAIT_MS)


def expect_no_waiting(page: Any) -> None:
    """``#waiting`` is absent, hidden or empty (contract: only an open approval fills it)."""
    page.wait_for_function(
        """() => { const w = document.getElementById("waiting");
                   return !w || w.hidden || w.textContent.trim() === ""; }""",
        timeout=WAIT_MS,
    )


def wait_status(run_id: str, *statuses: str) -> Run:
    """The stored run once its status is one of ``statuses``."""

    def reached() -> Run | None:
        run = Run.objects.get(pk=run_id)
        return run if run.status in statuses else None

    run = wait_for(reached, WAIT_MS / 1000, f"run {run_id} to be {' or '.join(statuses)}")
    assert isinstance(run, Run)
    return run
