"""The example chat page of docs/chat-client.md (templates/example/chat.html, project/static/example/
chat.js on chamvi_runs' client.js) in a real browser, under the bundled project's strict
Content-Security-Policy: streaming, a killed socket, a step retried after a worker crash, an
approval; and the bundled pages working under the same policy."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from chamvi_runs.models import Run, Step, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from tests.support.helpers import expire_lease
from tests.support.processes import WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, ScriptedServer, delay, finish, text
from tests.system.browser.conftest import ALLOW_ASYNC_UNSAFE, SUPPORT_MODEL, WAIT_MS, LiveSite, csp_violations
from tests.system.browser.flows import (
    REFUND_INPUT,
    expect,
    pretty,
    script,
    script_refund,
    start_via_api,
    wait_status,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

MESSAGE = "Order A-1001 arrived broken, please refund me."
THREAD_SOCKETS = "window.__sockets.filter(s => s.url.includes('/ws/chamvi/threads/'))"
# Everything the page's #connection said, in order: "reconnecting" lasts only the backoff's delay, too
# short to be sure to catch it by polling.
RECORD_CONNECTION = """() => {
  const connection = document.getElementById("connection");
  window.__connection = [connection.textContent];
  new MutationObserver(() => window.__connection.push(connection.textContent))
    .observe(connection, {childList: true, characterData: true, subtree: true});
}"""


def directives(response: Any) -> dict[str, list[str]]:
    """The response's Content-Security-Policy, directive by directive."""
    policy = response.headers.get("content-security-policy")
    assert policy, f"{response.url} has no Content-Security-Policy header"
    parsed = {}
    for directive in policy.split(";"):
        name, *values = directive.split()
        parsed[name] = values
    return parsed


def assert_strict_policy(response: Any) -> None:
    assert response.ok, (response.url, response.status)
    policy = directives(response)
    assert policy["script-src"] == ["'self'"], policy
    assert policy["style-src"] == ["'self'"], policy
    assert policy["connect-src"] == ["'self'"], policy


def assert_no_violations(page: Any) -> None:
    """Before leaving a page: the next document starts a new record."""
    assert csp_violations(page) == [], f"Content-Security-Policy violations on {page.url}"


def open_chat(page: Any, thread: str | None = None) -> tuple[Any, str]:
    """Opens the example chat page (of ``thread``, else of the thread it makes up); its response and
    the thread, once the page's socket is open."""
    response = page.goto("/example/chat/" + (f"?thread={thread}" if thread else ""))
    page.wait_for_function("() => location.search.includes('thread=')")
    (shown,) = parse_qs(urlsplit(page.url).query)["thread"]
    if thread:
        assert shown == thread
    expect(page.locator("#connection")).to_have_text("open")
    return response, shown


def send(page: Any, message: str) -> None:
    page.fill("#message", message)
    page.get_by_role("button", name="Send").click()


def run_of(thread: str) -> Run:
    run = wait_for(lambda: Run.objects.filter(thread=thread).first(), WAIT_MS / 1000, f"a run of {thread}")
    assert isinstance(run, Run)
    return run


def llm_step(run_id: str) -> Step:
    step = Step.objects.filter(run_id=run_id, kind="llm").order_by("-index").first()
    assert step is not None
    return step


@pytest.fixture(scope="module")
def replacements(live_site: LiveSite) -> Iterator[list[WorkerProcess]]:
    """The workers started in place of the live site's: stopped with the module, but for the one that is
    the site's now, which serves the suite's later modules and stops with the live site."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        if worker is not live_site.worker:
            worker.stop()


@pytest.fixture
def replace_worker(
    live_site: LiveSite, model_server: ScriptedServer, replacements: list[WorkerProcess]
) -> Iterator[Callable[[], WorkerProcess]]:
    """``replace_worker()`` starts a worker like the live site's and makes it the site's, for the
    module's later tests. A test that killed the site's worker and failed before replacing it leaves
    a live one all the same."""

    def start() -> WorkerProcess:
        env = worker_env(model_server.base_url, CHAMVI_MODEL=SUPPORT_MODEL)
        env.pop(ALLOW_ASYNC_UNSAFE, None)  # the servers keep Django's guard
        worker = WorkerProcess(env)
        replacements.append(worker)
        live_site.worker = worker
        wait_for(worker.ready, 60, worker.output)
        return worker

    yield start
    if live_site.worker.proc.poll() is not None:
        start()


@pytest.mark.timeout(60)
def test_the_example_page_streams_a_run_under_a_strict_policy(page, server):
    script(
        server,
        Reply(text("Hello, "), delay(1), text("let me look "), delay(0.3), text("into it."), finish("stop")),
    )
    response, thread = open_chat(page)
    assert thread.startswith("chat-"), thread
    assert_strict_policy(response)
    inline = page.locator("script").evaluate_all(
        "scripts => scripts.filter(s => !s.src && s.type !== 'application/json').map(s => s.outerHTML)"
    )
    assert inline == [], inline
    send(page, MESSAGE)
    expect(page.locator("#conversation .bubble.input").first).to_have_text(MESSAGE)
    bubble = page.locator("#conversation .bubble.step")
    # The first words are on the page while the model is still writing.
    expect(bubble.locator(".text")).to_have_text("Hello, ")
    expect(page.locator("#stop")).to_be_visible()
    expect(bubble.locator(".text")).to_have_text("Hello, let me look into it.")
    run = wait_status(run_of(thread).pk, "completed")
    expect(page.locator("#conversation section.run")).to_have_class("run completed")
    expect(bubble).to_have_count(1)
    expect(bubble).to_have_attribute("data-step", str(llm_step(run.pk).index))
    expect(page.locator("#stop")).to_be_hidden()
    assert llm_step(run.pk).output["text"] == "Hello, let me look into it."


@pytest.mark.timeout(60)
def test_the_example_page_survives_a_killed_socket(page, server):
    words = ["One ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight."]
    script(server, Reply(*(e for w in words for e in (text(w), delay(0.6))), finish("stop")))
    _, thread = open_chat(page)
    page.evaluate(RECORD_CONNECTION)
    send(page, MESSAGE)
    bubble = page.locator("#conversation .bubble.step")
    expect(bubble.locator(".text")).to_contain_text("One")
    run_id = run_of(thread).pk
    page.evaluate(f"{THREAD_SOCKETS}.at(-1).close()")
    page.wait_for_function(f"() => {THREAD_SOCKETS}.length >= 2")
    # The new socket names the seq the page has of the run, and the server replays what follows it.
    url = page.evaluate(f"{THREAD_SOCKETS}[1].url")
    assert f"&resume={run_id}%3A" in url, url
    # Dropped and back while the model was still writing: the words in between came by the replay.
    assert Run.objects.get(pk=run_id).status == "running"
    expect(page.locator("#connection")).to_have_text("open")
    said = page.evaluate("window.__connection")
    assert any(s.startswith("reconnecting in ") for s in said), said
    wait_status(run_id, "completed")
    stored = llm_step(run_id).output["text"]
    assert stored == "".join(words)
    expect(bubble.locator(".text")).to_have_text(stored)
    expect(bubble).to_have_count(1)


@pytest.mark.timeout(120)
def test_the_example_page_shows_a_step_retried_after_a_worker_crash_once(
    page, server, live_site, replace_worker
):
    script(
        server,
        # The crash comes in the pause: this attempt never finishes its step.
        Reply(text("First attempt, "), delay(20), text("never sent."), finish("stop")),
        Reply(text("Second attempt, "), delay(0.5), text("all of it."), finish("stop")),
    )
    _, thread = open_chat(page)
    send(page, MESSAGE)
    bubble = page.locator("#conversation .bubble.step")
    expect(bubble.locator(".text")).to_have_text("First attempt, ")
    run = run_of(thread)
    first = Run.objects.get(pk=run.pk).attempt
    expect(bubble).to_have_attribute("data-attempt", str(first))

    crashed = live_site.worker
    crashed.signal(signal.SIGKILL)
    crashed.wait(10)
    expire_lease(run.pk, attempt=first)
    replace_worker()
    # What chamvi_tick does in production: a run whose lease ran out goes back on the queue.
    tick_once()

    expect(bubble.locator(".text")).to_have_text("Second attempt, all of it.")
    expect(bubble).to_have_count(1)
    retried = wait_status(run.pk, "completed")
    assert retried.attempt > first
    step = llm_step(run.pk)
    assert (step.attempt, step.output["text"]) == (retried.attempt, "Second attempt, all of it.")
    expect(bubble).to_have_attribute("data-attempt", str(step.attempt))
    expect(bubble).to_have_attribute("data-step", str(step.index))
    expect(page.locator("#conversation")).not_to_contain_text("First attempt")
    assert len(server.requests) == 2


@pytest.mark.timeout(60)
def test_the_example_page_decides_an_approval(page, server, user):
    script_refund(server, Reply(text("Refunded 45.99."), finish("stop")))
    _, thread = open_chat(page)
    send(page, MESSAGE)
    approval = page.locator("#approval")
    expect(approval).to_be_visible()
    expect(page.locator("#approval-tool")).to_have_text("issue_refund")
    expect(page.locator("#approval-input")).to_have_text(pretty(REFUND_INPUT))
    run_id = wait_status(run_of(thread).pk, "waiting").pk
    page.fill("#approval-reason", "receipt checked")
    page.click("#approve")
    expect(approval).to_be_hidden()
    expect(page.locator("#conversation .bubble.step .text").last).to_have_text("Refunded 45.99.")
    expect(page.locator("#conversation")).to_contain_text(f"approved by {user.username}")
    wait_status(run_id, "completed")
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.decision, stored.reason, stored.decided_by) == ("approved", "receipt checked", user)
    expect(page.locator("#stop")).to_be_hidden()


@pytest.mark.timeout(90)
def test_the_bundled_pages_work_under_the_strict_policy(page, server, user):
    thread = "t-csp"
    response = page.goto("/")
    assert_strict_policy(response)
    expect(page.locator("#start")).to_be_visible()
    assert_no_violations(page)

    script_refund(server, Reply(text("Refunded 45.99."), finish("stop")))
    run_id = start_via_api(page, {"agent": "support", "payload": {"message": MESSAGE}, "thread": thread})
    wait_status(run_id, "waiting")
    assert_strict_policy(page.reload())
    waiting = page.locator("#waiting")
    expect(waiting).to_contain_text("issue_refund")
    expect(waiting.locator("pre")).to_have_text(pretty(REFUND_INPUT))
    assert_no_violations(page)

    response = page.goto("/chamvi/approvals/")
    assert_strict_policy(response)
    row = page.locator("tr.approval", has_text=run_id)
    expect(row).to_have_count(1)
    expect(row.locator("pre")).to_have_text(pretty(REFUND_INPUT))
    assert_no_violations(page)

    response = page.goto(f"/chamvi/runs/{run_id}/")
    assert_strict_policy(response)
    expect(waiting).to_contain_text("issue_refund")
    page.locator("#reason").fill("fine under the policy")
    waiting.locator("button[data-action=approve]").click()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("Refunded 45.99.")
    expect(page.locator("#decisions li.decision")).to_contain_text("fine under the policy")
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.decision, stored.decided_by) == ("approved", user)
    assert_no_violations(page)

    response = page.goto(f"/chamvi/threads/{thread}/")
    assert_strict_policy(response)
    section = page.locator(f".thread-run[data-run-id='{run_id}']")
    expect(section).to_contain_text(MESSAGE)
    expect(section.locator(".step .text").last).to_have_text("Refunded 45.99.")
    expect(section.locator(".run-status")).to_have_text("completed")
    # The page's own script (thread-page.js) ran: it follows the thread over its socket.
    page.wait_for_function(f"() => {THREAD_SOCKETS}.some(s => s.readyState === WebSocket.OPEN)")


@pytest.mark.timeout(60)
@pytest.mark.violates_csp
def test_the_policy_blocks_an_injected_inline_script_and_the_suite_sees_it(page):
    """What the policy is for, and proof that the suite's violation check is not blind."""
    open_chat(page)
    page.evaluate(
        """() => { const s = document.createElement("script");
                   s.textContent = "window.__injected = true"; document.body.append(s); }"""
    )
    page.wait_for_function("() => window.__violations.length > 0")
    assert page.evaluate("window.__injected") is None
    violations = page.evaluate("window.__violations")
    assert [v for v in violations if v.startswith("script-src") and v.endswith(" inline")], violations
