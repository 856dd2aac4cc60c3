"""Regenerate and edit-and-resend in a real browser (SPEC §12): an answer regenerated on the thread
page replaces the old one and the thread goes on from it; an earlier message edited three runs
deep starts the thread over from it (the runs after it leave the page, the new one streams in);
the example chat page's Regenerate. What the model is sent next is the proof of the branch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chamvi_runs.models import Run
from tests.support.processes import wait_for
from tests.support.scripted_server import Reply, ScriptedServer, delay, finish, text
from tests.system.browser.conftest import SUPPORT_MODEL
from tests.system.browser.flows import caught_up_to, expect, post_run, script, wait_status
from tests.system.browser.test_example_chat import open_chat, send

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BASIC = "m-basic"
SHOWN = "#thread-runs .thread-run:not([hidden])"


def answered(page: Any, server: ScriptedServer, thread: str, message: str, answer: str) -> str:
    """A run of ``basic`` in ``thread`` that answered ``answer``, settled."""
    server.script(BASIC, [Reply(text(answer), finish("stop"))])
    run_id = post_run(page, {"agent": "basic", "payload": message, "thread": thread})
    wait_status(run_id, "completed")
    return run_id


def said(request: dict[str, Any]) -> list[Any]:
    """What the user and the model said in a model request, in order: each trigger's payload (a
    chat message's text), each answer's text; no system prompt, no tool calls."""
    out: list[Any] = []
    for message in request["messages"]:
        role, content = message.get("role"), message.get("content")
        if role == "assistant" and isinstance(content, str) and content:
            out.append(content)
        elif role == "user":
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            out.extend(_payload(part["text"]) for part in parts if part.get("type") == "text")
    return out


def _payload(block: str) -> Any:
    """A trigger message's payload (core.messages.trigger_message), a chat message's text."""
    try:
        payload = json.loads(block).get("payload")
    except (ValueError, AttributeError):
        return block
    return payload["message"] if isinstance(payload, dict) and "message" in payload else payload


def section(page: Any, run_id: str) -> Any:
    return page.locator(f'#thread-runs .thread-run[data-run-id="{run_id}"]')


def new_run(thread: str, *known: str) -> Run:
    """The run of ``thread`` that is none of ``known``, once it exists."""
    run = wait_for(lambda: Run.objects.filter(thread=thread).exclude(pk__in=known).first(), 15, "the new run")
    assert isinstance(run, Run)
    return run


def test_a_regenerated_answer_replaces_the_old_one_and_the_thread_goes_on_from_it(page, server, user, shoot):
    page.goto("/chamvi/approvals/")
    first = answered(page, server, "t-regen", "I am Ada.", "Hello Ada.")
    second = answered(page, server, "t-regen", "Who am I?", "You are Bob.")
    page.goto("/chamvi/threads/t-regen/")
    expect(page.locator(SHOWN)).to_have_count(2)
    old = section(page, second)
    expect(old.locator(".step .text")).to_have_text("You are Bob.")
    regenerate = old.get_by_role("button", name="Regenerate")
    expect(regenerate).to_be_enabled()

    server.script(BASIC, [Reply(text("You are "), delay(0.5), text("Ada."), finish("stop"))])
    regenerate.click()
    # The new run takes the old one's place: the page shows the thread's branch only.
    expect(page.locator(SHOWN)).to_have_count(2)
    expect(old).to_be_hidden()
    again = page.locator(SHOWN).last
    expect(again.locator(".step .text")).to_have_text("You are Ada.")
    expect(again.locator(".trigger-message")).to_have_text("Who am I?")
    expect(again.locator(".run-status")).to_have_text("completed")
    regenerated = again.get_attribute("data-run-id")
    assert regenerated not in (first, second)
    expect(again.locator(".lineage")).to_have_text(f"Regenerated from {second}")
    assert Run.objects.get(pk=regenerated).replaces_id == second
    # The model answered again from the history the old run started from.
    assert said(server.requests_for(BASIC)[-1]) == ["I am Ada.", "Hello Ada.", "Who am I?"]
    # The replaced run stays reachable: listed, and shown in place on demand.
    expect(page.locator("#replaced-runs li")).to_have_count(1)
    expect(page.locator("#replaced-runs .replaced-link")).to_have_attribute("href", f"/chamvi/runs/{second}/")
    page.locator("#show-replaced").check()
    expect(old).to_be_visible()
    expect(old.locator(".replaced-mark")).to_have_text(f"Replaced by {regenerated}")
    shoot("thread-regenerated", full_page=True)
    page.locator("#show-replaced").uncheck()
    expect(old).to_be_hidden()

    # The thread's next message goes on from the regenerated answer, never from the old one.
    server.script(BASIC, [Reply(text("Nice to meet you."), finish("stop"))])
    following = post_run(page, {"agent": "basic", "payload": "Nice.", "thread": "t-regen"})
    expect(section(page, following).locator(".step .text")).to_have_text("Nice to meet you.")
    expect(page.locator(SHOWN)).to_have_count(3)
    expect(section(page, following).locator(".trigger-message")).to_have_text("Nice.")
    sent = said(server.requests_for(BASIC)[-1])
    assert sent == ["I am Ada.", "Hello Ada.", "Who am I?", "You are Ada.", "Nice."], sent

    # Reloaded, the server draws the same branch and links the replaced run.
    page.reload()
    caught_up_to(page, "run.end")
    expect(page.locator(SHOWN)).to_have_count(3)
    expect(page.locator(f"{SHOWN} .step .text")).to_have_text(
        ["Hello Ada.", "You are Ada.", "Nice to meet you."]
    )
    expect(page.locator("#replaced-count")).to_have_text("1")
    expect(section(page, second)).to_be_hidden()


def test_an_earlier_message_edited_three_runs_deep_starts_the_thread_over_from_it(page, server, user, shoot):
    page.goto("/chamvi/approvals/")
    runs = [
        answered(page, server, "t-edit", "one", "One."),
        answered(page, server, "t-edit", "two", "Two."),
        answered(page, server, "t-edit", "three", "Three."),
    ]
    page.goto("/chamvi/threads/t-edit/")
    expect(page.locator(SHOWN)).to_have_count(3)
    first = section(page, runs[0])
    first.get_by_role("button", name="Edit").click()
    editor = first.locator("textarea.edit-text")
    expect(editor).to_have_value("one")
    editor.fill("uno")
    shoot("thread-edit-message")

    server.script(BASIC, [Reply(text("Uno, "), delay(1.5), text("then."), finish("stop"))])
    first.get_by_role("button", name="Send").click()
    # The runs after the edited message leave the page; the new run streams in.
    for run_id in runs:
        expect(section(page, run_id)).to_be_hidden()
    edited = page.locator(SHOWN)
    expect(edited).to_have_count(1)
    expect(edited.locator(".step .text")).to_have_text("Uno,")
    # While it runs nothing else may be regenerated or edited.
    expect(edited.locator(".run-status")).to_have_text("running")
    for button in page.locator("#thread-runs button[data-action]").all():
        expect(button).to_be_disabled()
    expect(edited.locator(".step .text")).to_have_text("Uno, then.")
    expect(edited.locator(".run-status")).to_have_text("completed")
    expect(edited.locator(".trigger-message")).to_have_text("uno")
    expect(edited.locator(".lineage")).to_have_text(f"Edited from {runs[0]}")
    expect(edited.get_by_role("button", name="Regenerate")).to_be_enabled()
    assert said(server.requests_for(BASIC)[-1]) == ["uno"]
    expect(page.locator("#replaced-runs li")).to_have_count(3)

    server.script(BASIC, [Reply(text("Dos."), finish("stop"))])
    following = post_run(page, {"agent": "basic", "payload": "dos", "thread": "t-edit"})
    expect(section(page, following).locator(".step .text")).to_have_text("Dos.")
    expect(page.locator(SHOWN)).to_have_count(2)
    assert said(server.requests_for(BASIC)[-1]) == ["uno", "Uno, then.", "dos"]


def test_the_example_chat_page_regenerates_an_answer(page, server, user, shoot):
    _, thread = open_chat(page, "chat-regenerate")
    script(server, Reply(text("It shipped yesterday."), finish("stop")))
    send(page, "Where is my order?")
    conversation = page.locator("#conversation")
    expect(conversation).to_contain_text("It shipped yesterday.")
    old = new_run(thread)
    wait_status(old.pk, "completed")

    script(server, Reply(text("It is "), delay(0.5), text("on its way."), finish("stop")))
    conversation.get_by_role("button", name="Regenerate").click()
    expect(conversation).to_contain_text("It is on its way.")
    expect(conversation).not_to_contain_text("It shipped yesterday.")
    # One exchange: the message, asked again, and its new answer.
    expect(conversation.locator("section")).to_have_count(1)
    expect(conversation.locator(".bubble.input")).to_have_text("Where is my order? Edit")
    regenerated = new_run(thread, old.pk)
    assert regenerated.replaces_id == old.pk
    wait_status(regenerated.pk, "completed")
    shoot("chat-regenerated")

    script(server, Reply(text("You are welcome."), finish("stop")))
    send(page, "Thanks!")
    expect(conversation).to_contain_text("You are welcome.")
    sent = said(server.requests_for(SUPPORT_MODEL)[-1])
    assert sent[-3:] == ["Where is my order?", "It is on its way.", "Thanks!"], sent
    assert "It shipped yesterday." not in sent


def test_the_example_chat_page_edits_an_earlier_message(page, server, user):
    _, thread = open_chat(page, "chat-edit")
    conversation = page.locator("#conversation")
    script(server, Reply(text("Hello."), finish("stop")))
    send(page, "Hi")
    expect(conversation).to_contain_text("Hello.")
    first = new_run(thread)
    wait_status(first.pk, "completed")
    script(server, Reply(text("Which order?"), finish("stop")))
    send(page, "Where is my order?")
    expect(conversation).to_contain_text("Which order?")
    second = new_run(thread, first.pk)
    wait_status(second.pk, "completed")

    conversation.locator("section").first.get_by_role("button", name="Edit").click()
    editor = conversation.locator("form.edit-form input")
    expect(editor).to_have_value("Hi")
    editor.fill("Hi, I am Ada")
    script(server, Reply(text("Hello Ada."), finish("stop")))
    conversation.locator("form.edit-form").get_by_role("button", name="Send").click()
    # The conversation starts over from the edited message: the runs after it are gone.
    expect(conversation).to_contain_text("Hello Ada.")
    expect(conversation.locator("section")).to_have_count(1)
    expect(conversation).not_to_contain_text("Which order?")
    edited = new_run(thread, first.pk, second.pk)
    assert edited.replaces_id == first.pk
    # The same shape of payload as a new message.
    assert edited.trigger["payload"] == {"message": "Hi, I am Ada"}
    assert said(server.requests_for(SUPPORT_MODEL)[-1]) == ["Hi, I am Ada"]
