"""The run chat page in a real browser: starting from the home page, streaming, approving, denying,
cancelling, steering, a dropped websocket, and reloading finished runs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from chamvi_runs import approve, deny
from chamvi_runs.models import Step, WaitPoint
from tests.support.scripted_server import Reply, delay, finish, text, tool_call
from tests.system.browser.flows import (
    REFUND_INPUT,
    caught_up_to,
    expect,
    expect_no_waiting,
    pretty,
    script,
    script_refund,
    start_from_home,
    wait_status,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

MESSAGE = "Order A-1001 arrived broken, please refund me."


def final_text(run_id: str) -> str:
    step = Step.objects.filter(run_id=run_id, kind="llm").order_by("-index", "-attempt").first()
    assert step is not None
    return step.output["text"]


def test_a_run_started_from_the_home_page_streams_its_text_as_it_comes(page, server, shoot):
    # The pause keeps the step open while the first words are already on the page.
    script(server, Reply(text("Hello, "), text("let me look. "), delay(3), text("Done."), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    expect(page.locator("#trigger pre")).to_have_text(pretty({"message": MESSAGE}))
    step = page.locator("#log .step .text")
    expect(step).to_have_text("Hello, let me look. ")
    expect(page.locator("#status")).to_have_text("running")
    shoot("run-streaming")
    expect(page.locator("#status")).to_have_text("completed")
    expect(step).to_have_text("Hello, let me look. Done.")
    assert final_text(run_id) == "Hello, let me look. Done."
    expect(page.locator("#controls")).to_be_hidden()


def test_approve_on_the_run_page(page, server, shoot, user):
    script_refund(server, Reply(text("Refunded 45.99."), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    waiting = page.locator("#waiting")
    expect(waiting).to_contain_text("issue_refund")
    expect(waiting.locator("pre")).to_have_text(pretty(REFUND_INPUT))
    expect(page.locator("#status")).to_have_text("waiting")
    caught_up_to(page, "run.waiting")
    page.locator("#reason").fill("receipt checked")
    shoot("run-waiting-for-approval")
    waiting.locator("button[data-action=approve]").click()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("Refunded 45.99.")
    expect_no_waiting(page)
    decision = page.locator("#decisions li.decision")
    expect(decision).to_have_count(1)
    for word in ("approved", "issue_refund", user.username, "receipt checked"):
        expect(decision).to_contain_text(word)
    expect(page.locator("#controls")).to_be_hidden()
    shoot("run-decided", full_page=True)
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.decision, stored.decided_by, stored.reason) == ("approved", user, "receipt checked")


def test_deny_on_the_run_page_with_a_reason(page, server, user):
    script_refund(server, Reply(text("I cannot refund it, sorry."), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    expect(page.locator("#waiting")).to_contain_text("issue_refund")
    caught_up_to(page, "run.waiting")
    page.locator("#reason").fill("no photo of the damage")
    page.locator("#waiting button[data-action=deny]").click()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("I cannot refund it, sorry.")
    expect_no_waiting(page)
    decision = page.locator("#decisions li.decision")
    for word in ("denied", "issue_refund", user.username, "no photo of the damage"):
        expect(decision).to_contain_text(word)
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.decision, stored.reason) == ("denied", "no photo of the damage")


def test_a_reason_typed_before_the_socket_catches_up_is_kept(page, server, user):
    """The page shows the open approval from the server; a reason typed while the socket's replay is
    still on its way (a slow connection) must survive the replayed run.waiting."""
    script_refund(server, Reply(text("I cannot refund it, sorry."), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    wait_status(run_id, "waiting")
    held: list[str | bytes] = []
    routes: list[Any] = []
    released = False

    def from_server(message: str | bytes) -> None:
        if released:
            routes[-1].send(message)
        else:
            held.append(message)

    def hold_replies(ws: Any) -> None:
        server_side = ws.connect_to_server()
        # Playwright wraps handlers in attributes: plain functions, not bound builtins.
        server_side.on_message(from_server)
        ws.on_message(lambda message: server_side.send(message))
        routes.append(ws)

    page.route_web_socket(re.compile(r"/ws/chamvi/runs/"), hold_replies)
    page.reload()
    page.locator("#reason").fill("the box was dry")
    # Playwright delivers the socket's messages only while it has control: wait through it, not sleep.
    for _ in range(300):
        if routes and any('"run.waiting"' in str(m) for m in held):
            break
        page.wait_for_timeout(50)
    else:
        raise AssertionError(f"the replay brought no run.waiting: {held}")
    for message in held:
        routes[-1].send(message)
    released = True  # from here on the socket is a plain connection again
    caught_up_to(page, "run.waiting")
    expect(page.locator("#reason")).to_have_value("the box was dry")
    page.locator("#waiting button[data-action=deny]").click()
    expect(page.locator("#decisions li.decision")).to_contain_text("the box was dry")
    assert wait_status(run_id, "completed").waitpoints.get().reason == "the box was dry"


def test_cancel_mid_stream_marks_the_cut_text(page, server):
    script(server, Reply(text("I am writing a long "), delay(30), text("answer."), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    step = page.locator("#log .step").last
    expect(step.locator(".text")).to_have_text("I am writing a long ")
    page.locator("#cancel").click()
    expect(page.locator("#status")).to_have_text("cancelled")
    expect(step.locator(".cut")).to_have_text("— stopped: the run was cancelled")
    expect(step.locator(".text")).to_have_text("I am writing a long ")
    # "Cancel requested (the run is running)." is no longer true: it goes.
    expect(page.locator("#notice")).to_have_text("")
    expect(page.locator("#controls")).to_be_hidden()
    wait_status(run_id, "cancelled")


def test_cancel_while_waiting_for_an_approval(page, server):
    script_refund(server)
    run_id = start_from_home(page, MESSAGE)
    expect(page.locator("#waiting")).to_contain_text("issue_refund")
    page.locator("#cancel").click()
    expect(page.locator("#status")).to_have_text("cancelled")
    expect_no_waiting(page)
    expect(page.locator("#decisions li.decision")).to_contain_text("cancelled")
    expect(page.locator("#controls")).to_be_hidden()
    wait_status(run_id, "cancelled")
    assert WaitPoint.objects.get(run_id=run_id).decision == "cancelled"


def test_steering_shows_the_message_in_the_conversation(page, server):
    script(
        server,
        # The pause lets the user type while the first step streams; the steer joins the next call.
        Reply(
            text("Looking the order up. "),
            delay(4),
            tool_call("c1", "lookup_order", '{"order_id": "A-1001"}'),
            finish("tool_calls"),
        ),
        Reply(text("Express it is."), finish("stop")),
    )
    run_id = start_from_home(page, MESSAGE)
    expect(page.locator("#log .step .text").first).to_have_text("Looking the order up. ")
    page.locator("#input-text").fill("Please ship the replacement express.")
    page.locator("#send").click()
    steer = page.locator("#log .input")
    expect(steer).to_have_text("Please ship the replacement express.")
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("Express it is.")
    # In the conversation it comes after the first step's tool result, before the answer.
    order = page.locator("#log > *").evaluate_all("els => els.map(e => e.className)")
    assert [c for c in order if "input" in c.split()], order
    assert order.index(next(c for c in order if "input" in c.split())) > order.index(
        next(c for c in order if "tool-result" in c.split())
    ), order
    second_call = server.requests[1]["messages"]
    assert {"role": "user", "content": "Please ship the replacement express."} in second_call
    wait_status(run_id, "completed")


def test_a_dropped_websocket_reconnects_and_recovers_the_whole_text(page, server):
    words = ["One ", "two ", "three ", "four ", "five."]
    script(server, Reply(*(e for w in words for e in (text(w), delay(0.6))), finish("stop")))
    run_id = start_from_home(page, MESSAGE)
    step = page.locator("#log .step .text")
    expect(step).to_contain_text("One")
    # The socket drops while words keep coming: the page reconnects with ?after= and catches up.
    page.evaluate("window.__sockets.filter(s => s.url.includes('/ws/chamvi/runs/')).at(-1).close()")
    expect(page.locator("#status")).to_have_text("completed")
    expect(step).to_have_text("One two three four five.")
    assert final_text(run_id) == "One two three four five."
    urls = page.evaluate("window.__sockets.map(s => s.url).filter(u => u.includes('/ws/chamvi/runs/'))")
    assert len(urls) >= 2 and "after=0" not in urls[-1], urls


def test_reloading_finished_runs_shows_their_decisions_and_no_controls(page, server, user):
    script_refund(server, Reply(text("Refunded."), finish("stop")))
    approved = start_from_home(page, MESSAGE)
    approve(wait_status(approved, "waiting").waitpoints.get().approval_id, by=user, reason="fine by me")
    wait_status(approved, "completed")
    script_refund(server, Reply(text("Not refunded."), finish("stop")))
    denied = start_from_home(page, MESSAGE)
    deny(wait_status(denied, "waiting").waitpoints.get().approval_id, by=user, reason="out of policy")
    wait_status(denied, "completed")

    for run_id, decision, reason, answer in (
        (approved, "approved", "fine by me", "Refunded."),
        (denied, "denied", "out of policy", "Not refunded."),
    ):
        page.goto(f"/chamvi/runs/{run_id}/")
        expect(page.locator("#status")).to_have_text("completed")
        expect(page.locator("#log .step .text").last).to_have_text(answer)
        expect_no_waiting(page)
        item = page.locator("#decisions li.decision")
        expect(item).to_have_count(1)
        for word in (decision, "issue_refund", user.username, reason):
            expect(item).to_contain_text(word)
        expect(page.locator("#controls")).to_be_hidden()
        expect(page.locator("a#to-site")).to_have_attribute("href", "/")
        expect(page.locator("a#to-approvals")).to_have_attribute("href", "/chamvi/approvals/")
