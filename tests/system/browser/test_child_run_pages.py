"""Child runs (SPEC §13) in a real browser: a parent's run page shows the child run its model call
started, nested under that call, streaming; the child's approval is decided on the parent's page,
and both runs go on to complete."""

from __future__ import annotations

import json

import pytest

from chamvi_runs.models import Run, WaitPoint
from tests.support.scripted_server import Reply, finish, text, tool_call
from tests.system.browser.flows import expect, start_via_api, wait_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

REFUND = {"order_id": "o-7", "amount_cents": 500}


def test_the_parent_page_shows_its_child_and_decides_the_childs_approval(page, server, user, shoot):
    server.script(
        "m-triage",
        [
            Reply(
                text("Handing it to billing."),
                tool_call("c1", "billing", '{"task": "refund order 7"}'),
                finish("tool_calls"),
            ),
            Reply(text("Billing refunded order 7."), finish("stop")),
        ],
    )
    server.script(
        "m-billing",
        [
            Reply(
                text("Refunding order 7."),
                tool_call("r1", "refund", json.dumps(REFUND)),
                finish("tool_calls"),
            ),
            Reply(text("Refunded 5.00."), finish("stop")),
        ],
    )
    parent_id = start_via_api(page, {"agent": "triage", "payload": "Refund order 7, it arrived broken."})
    child = page.locator("#log .child-run")
    expect(child).to_have_count(1)
    child_id = Run.objects.get(parent_id=parent_id).pk
    expect(child).to_have_attribute("data-run-id", child_id)
    # Nested under the model call that started it, with the child's own streamed text.
    expect(page.locator("#log .step[data-step='0'] + .child-run")).to_have_count(1)
    expect(child.locator(".child-log .step .text").first).to_have_text("Refunding order 7.")
    expect(child).to_have_attribute("data-status", "waiting")
    box = page.locator("#waiting .approval")
    expect(box).to_have_count(1)
    expect(box.locator(".child-of")).to_have_text(f"Asked by the child run {child_id}.")
    expect(box.locator(".tool-name")).to_have_text("refund")
    shoot("parent-page-child-approval")
    box.get_by_role("button", name="Approve").click()
    expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
    expect(child).to_have_attribute("data-status", "completed")
    expect(child.locator(".child-log .step .text").last).to_have_text("Refunded 5.00.")
    expect(page.locator("#log > .step .text").last).to_have_text("Billing refunded order 7.")
    decided = WaitPoint.objects.get(run_id=child_id)
    assert (decided.decision, decided.decided_by) == ("approved", user)
    assert wait_status(parent_id, "completed").output == "Billing refunded order 7."
