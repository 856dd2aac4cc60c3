"""Questions to the run's user and approvals edited before they are approved (issue 19), in a real
browser: a question answered on the run page and the run going on with the answer, two questions of
one model call, an answer the question's schema refuses, arguments edited on the approvals page and
on the run page, a question answered on the thread page and on the example chat page."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chamvi_runs.models import Step, WaitPoint
from tests.support.scripted_server import Reply, ScriptedServer, finish, text, tool_call
from tests.system.browser.flows import (
    REFUND_INPUT,
    caught_up_to,
    expect,
    expect_no_waiting,
    script_refund,
    start_from_home,
    start_via_api,
    wait_status,
)
from tests.testapp.models import Refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]


def ask(
    server: ScriptedServer, agent: str, *calls: tuple[str, dict[str, Any]], then: str = "Thanks."
) -> None:
    """The model of ``agent`` calls each (tool, arguments) of ``calls`` in one model call, then
    answers ``then``."""
    asked = [tool_call(f"c{i}", name, json.dumps(arguments)) for i, (name, arguments) in enumerate(calls)]
    server.script(f"m-{agent}", [Reply(*asked, finish("tool_calls")), Reply(text(then), finish("stop"))])


def tool_results(server: ScriptedServer, request: int) -> list[str]:
    """The tool results the model was sent in its ``request``-th call (from 0)."""
    messages = server.requests[request]["messages"]
    return [m["content"] for m in messages if m.get("role") == "tool"]


def test_a_question_answered_on_the_run_page_goes_back_to_the_model(page, server, user, shoot):
    ask(server, "asking", ("ask_user", {"question": "Which colour would you like?"}), then="Blue it is.")
    run_id = start_via_api(page, {"agent": "asking", "payload": "Paint my fence."})
    box = page.locator("#waiting .question")
    expect(box).to_have_count(1)
    expect(box.locator(".question-text")).to_have_text("Which colour would you like?")
    expect(page.locator("#status")).to_have_text("waiting")
    caught_up_to(page, "run.waiting")
    expect(box.locator("button[data-action]")).to_have_count(0)
    box.locator("input[name=answer]").fill("deep blue")
    shoot("run-question")
    box.get_by_role("button", name="Answer").click()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("Blue it is.")
    # The answer is the tool's result in the conversation, and a decision with who gave it.
    expect(page.locator("#log .tool-result").last).to_contain_text('"deep blue"')
    decision = page.locator("#decisions li.decision")
    expect(decision).to_have_count(1)
    expect(decision).to_contain_text(f"answered: deep blue (ask_user) by {user.username}")
    expect_no_waiting(page)
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.kind, stored.decision, stored.answer) == ("input", "answered", "deep blue")
    assert stored.decided_by == user
    assert "deep blue" in tool_results(server, 1)[0]
    # Reloaded, the page says the same from the server.
    page.reload()
    said = f"answered: deep blue (ask_user) by {user.username}"
    expect(page.locator("#decisions li.decision")).to_contain_text(said)


def test_two_questions_of_one_model_call_have_a_form_each(page, server, user, shoot):
    ask(
        server,
        "asking_two",
        ("ask_user", {"question": "Where should it go?"}),
        ("confirm", {"question": "Gift-wrap it?"}),
        then="Wrapped and on its way.",
    )
    run_id = start_via_api(page, {"agent": "asking_two", "payload": "Send the grinder to my mother."})
    boxes = page.locator("#waiting .question")
    expect(boxes).to_have_count(2)
    caught_up_to(page, "run.waiting")
    where, wrap = boxes.nth(0), boxes.nth(1)
    expect(where).to_contain_text("Where should it go?")
    expect(wrap).to_contain_text("Gift-wrap it?")
    shoot("run-two-questions")
    # A yes/no question is answered with a button.
    expect(wrap.get_by_role("button", name="Yes")).to_be_visible()
    wrap.get_by_role("button", name="Yes").click()
    expect(boxes).to_have_count(1)
    expect(page.locator("#notice")).to_have_text(
        "Answered: the run goes on once the other questions are answered."
    )
    # The run waits for the other answer.
    assert wait_status(run_id, "waiting").status == "waiting"
    where.locator("input[name=answer]").fill("12 Baker Street")
    where.get_by_role("button", name="Answer").click()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#log .step .text").last).to_have_text("Wrapped and on its way.")
    expect_no_waiting(page)
    answers = dict(WaitPoint.objects.filter(run_id=run_id).values_list("tool_name", "answer"))
    assert answers == {"ask_user": "12 Baker Street", "confirm": True}
    sent = tool_results(server, 1)
    assert len(sent) == 2 and "12 Baker Street" in sent[0] and "true" in sent[1], sent
    page.reload()
    decisions = page.locator("#decisions li.decision")
    expect(decisions).to_have_count(2)
    expect(decisions.filter(has_text="(confirm)")).to_contain_text("answered: true")


def test_an_answer_the_schema_refuses_is_said_beside_its_form(page, server, user, shoot):
    ask(server, "asking", ("choose_shipping", {"question": "How should we ship?"}), then="Express it is.")
    run_id = start_via_api(page, {"agent": "asking", "payload": "Ship my order."})
    box = page.locator("#waiting .question")
    expect(box.locator("form.answer-form")).to_have_attribute("data-form", "json")
    caught_up_to(page, "run.waiting")
    field = box.locator("textarea[name=answer]")
    # Not JSON: the page says so and sends nothing.
    field.fill("express please")
    box.get_by_role("button", name="Answer").click()
    expect(box.locator(".answer-error")).to_contain_text("not JSON")
    # JSON the schema refuses: the server's 400 is shown where the answer was typed, nothing else changes.
    field.fill('{"speed": "rocket"}')
    box.get_by_role("button", name="Answer").click()
    error = box.locator(".answer-error")
    expect(error).to_contain_text("invalid_answer")
    expect(error).to_contain_text("speed")
    shoot("run-answer-refused")
    expect(field).to_have_value('{"speed": "rocket"}')
    expect(page.locator("#status")).to_have_text("waiting")
    expect(page.locator("#decisions li.decision")).to_have_count(0)
    assert WaitPoint.objects.get(run_id=run_id).decision is None
    field.fill('{"speed": "express", "gift": true}')
    box.get_by_role("button", name="Answer").click()
    expect(page.locator("#status")).to_have_text("completed")
    assert WaitPoint.objects.get(run_id=run_id).answer == {"speed": "express", "gift": True}


def test_arguments_edited_on_the_approvals_page_are_what_the_tool_runs_with(page, server, user, shoot):
    server.script(
        "m-approving",
        [
            Reply(tool_call("c1", "refund", json.dumps(REFUND_INPUT)), finish("tool_calls")),
            Reply(text("Refunded 20.00."), finish("stop")),
        ],
    )
    run_id = start_via_api(page, {"agent": "approving", "payload": "Refund order A-1001."})
    wait_status(run_id, "waiting")
    page.goto("/chamvi/approvals/")
    row = page.locator("tr.approval", has_text=run_id)
    row.get_by_text("Edit arguments").click()
    editor = row.locator("textarea[name=arguments]")
    expect(editor).to_have_value(json.dumps(REFUND_INPUT, indent=2))
    # Not JSON: said, nothing sent.
    editor.fill("{oops")
    row.locator("button[value=approve]").click()
    expect(page.locator(".messages .error")).to_contain_text("not JSON")
    # Arguments that do not fit the tool: the server's refusal is said, the row stays.
    editor.fill(json.dumps({**REFUND_INPUT, "amount_cents": "a lot"}))
    row.locator("button[value=approve]").click()
    expect(page.locator(".messages .error")).to_contain_text("invalid_arguments")
    expect(row).to_have_count(1)
    assert WaitPoint.objects.get(run_id=run_id).decision is None
    editor.fill(json.dumps({**REFUND_INPUT, "amount_cents": 2000}, indent=2))
    expect(row.locator("button[value=approve]")).to_have_text("Approve edited")
    shoot("approvals-edit-arguments")
    row.locator("button[value=approve]").click()
    expect(page.locator(".messages .success")).to_contain_text("Approved with your changes")
    expect(page.locator("tr.approval", has_text=run_id)).to_have_count(0)
    wait_status(run_id, "completed")
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.input, stored.approved_input) == (REFUND_INPUT, {**REFUND_INPUT, "amount_cents": 2000})
    assert list(Refund.objects.values_list("amount_cents", flat=True)) == [2000]
    page.goto(f"/chamvi/runs/{run_id}/")
    change = page.locator("#decisions li.decision .change")
    expect(change).to_have_count(1)
    expect(change).to_have_text("amount_cents 4599 → 2000")
    shoot("run-edited-approval", full_page=True)
    expect(page.locator("#log .tool-call").last).to_contain_text('"amount_cents": 2000')


def test_arguments_edited_on_the_run_page_show_live_as_a_change(page, server, user):
    script_refund(server, Reply(text("Refunded 10.00."), finish("stop")))
    run_id = start_from_home(page, "Order A-1001 arrived broken.")
    box = page.locator("#waiting .approval")
    expect(box).to_contain_text("issue_refund")
    caught_up_to(page, "run.waiting")
    box.get_by_text("Edit arguments").click()
    box.locator("textarea.arguments").fill(json.dumps({**REFUND_INPUT, "amount_cents": 1000}))
    box.locator("button[data-action=approve]").click()
    expect(page.locator("#status")).to_have_text("completed")
    decision = page.locator("#decisions li.decision")
    expect(decision).to_contain_text(f"approved issue_refund by {user.username}")
    expect(decision.locator(".change")).to_have_text("amount_cents 4599 → 1000")
    call = Step.objects.filter(run_id=run_id, kind="tool").get()
    assert call.input == {**REFUND_INPUT, "amount_cents": 1000}


def test_a_question_is_answered_on_the_thread_page(page, server, user):
    ask(server, "confirming", ("confirm", {"question": "Shall I add 2 and 3?"}), then="It is 5.")
    run_id = start_via_api(page, {"agent": "confirming", "payload": "Add things.", "thread": "t-confirm"})
    wait_status(run_id, "waiting")
    page.goto("/chamvi/threads/t-confirm/")
    box = page.locator(".thread-run .question")
    expect(box).to_contain_text("Shall I add 2 and 3?")
    caught_up_to(page, "run.waiting")
    box.get_by_role("button", name="No").click()
    expect(page.locator(".thread-run .run-status")).to_have_text("completed")
    expect(page.locator(".thread-run .question")).to_have_count(0)
    assert WaitPoint.objects.get(run_id=run_id).answer is False


def test_a_question_is_answered_on_the_example_chat_page(page, server, user):
    ask(server, "asking", ("ask_user", {"question": "What is your order number?"}), then="Found it.")
    page.goto("/example/chat/?thread=chat-asking")
    expect(page.locator("#connection")).to_have_text("open")
    status, run = page.evaluate(
        """async (body) => {
          const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
          const r = await fetch("/chamvi/api/runs/", {method: "POST", body: JSON.stringify(body),
            headers: {"Content-Type": "application/json", "X-CSRFToken": csrf}});
          return [r.status, await r.json()];
        }""",
        {"agent": "asking", "payload": {"message": "Where is my order?"}, "thread": "chat-asking"},
    )
    assert status == 201, run
    form = page.locator("#questions form.question")
    expect(form).to_contain_text("What is your order number?")
    form.locator("input[name=answer]").fill("A-1001")
    form.get_by_role("button", name="Answer").click()
    expect(page.locator("#questions form")).to_have_count(0)
    expect(page.locator("#conversation")).to_contain_text("Found it.")
    expect(page.locator("#conversation")).to_contain_text(f"answered: A-1001 by {user.username}")
    assert WaitPoint.objects.get(run_id=run["id"]).answer == "A-1001"
