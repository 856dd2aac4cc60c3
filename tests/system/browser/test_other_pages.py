"""The approvals page, the admin and the thread page in a real browser."""

from __future__ import annotations

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import WaitPoint
from tests.support.helpers import admin_url
from tests.support.scripted_server import Reply, finish, text
from tests.system.browser.flows import (
    REFUND_INPUT,
    expect,
    pretty,
    script,
    script_refund,
    start_from_home,
    start_via_api,
    wait_status,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_approve_on_the_approvals_page(page, server, shoot, user):
    script_refund(server, Reply(text("Refunded."), finish("stop")))
    run_id = start_from_home(page, "Order A-1001 arrived broken.")
    wait_status(run_id, "waiting")
    page.goto("/chamvi/approvals/")
    row = page.locator("tr.approval", has_text=run_id)
    expect(row).to_have_count(1)
    expect(row.locator("pre")).to_have_text(pretty(REFUND_INPUT))
    expect(row.locator(f"a[href='/chamvi/runs/{run_id}/']")).to_be_visible()
    expect(page.locator("a#to-site")).to_have_attribute("href", "/")
    row.locator("input[name=reason]").fill("customer is a regular")
    shoot("approvals-page")
    expect(row.locator("td.asked-by")).to_contain_text(user.username)
    row.locator("button[name=action][value=approve]").click()
    expect(page.locator(".messages .success")).to_contain_text("pproved")
    expect(page.locator("tr.approval", has_text=run_id)).to_have_count(0)
    expect(page.locator("p.empty")).to_contain_text("Every approval on this page is decided")
    stored = WaitPoint.objects.get(run_id=run_id)
    assert (stored.decision, stored.decided_by, stored.reason) == ("approved", user, "customer is a regular")
    page.goto(f"/chamvi/runs/{run_id}/")
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#decisions li.decision")).to_contain_text("customer is a regular")


def test_the_admin_is_styled(page):
    page.goto("/admin/")
    expect(page.locator("#header")).to_be_visible()
    page.wait_for_function(
        # A stylesheet that failed to load has no rules to read (reading them throws).
        """() => [...document.styleSheets].some(s => {
          try { return (s.href || "").includes("/static/admin/css/base.css") && s.cssRules.length > 0; }
          catch { return false; }
        })"""
    )
    # The stylesheet's rules are applied: the header is not the browser's default transparent box.
    background = page.locator("#header").evaluate("el => getComputedStyle(el).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background


def test_the_admin_run_page_is_read_only_and_links_to_the_site(page, server, user, shoot, live_site):
    script(server, Reply(text("Hello from the admin test."), finish("stop")))
    run = start_run("support", {"message": "hi"}, created_by=user)
    wait_status(run.pk, "completed")
    page.goto("/admin/chamvi_runs/run/")
    expect(page.locator("#result_list")).to_contain_text(run.pk)
    shoot("admin-run-list")
    page.goto(admin_url(run))
    expect(page.locator("#content")).to_contain_text(run.pk)
    expect(page.locator("input[name=_save], input[name=_continue], input[name=_addanother]")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)
    view_on_site = page.locator("a.viewsitelink")
    expect(view_on_site).to_be_visible()
    view_on_site.click()
    expect(page).to_have_url(f"{live_site.url}/chamvi/runs/{run.pk}/")
    expect(page.locator("#status")).to_have_text("completed")


def test_the_thread_page_shows_earlier_runs(page, server, live_site):
    script(server, Reply(text("Nice to meet you, Ada."), finish("stop")))
    first = start_via_api(page, {"agent": "support", "payload": "I am Ada", "thread": "t-ada"})
    expect(page.locator("#status")).to_have_text("completed")
    script(server, Reply(text("You are Ada."), finish("stop")))
    second = start_via_api(page, {"agent": "support", "payload": "Who am I?", "thread": "t-ada"})
    expect(page.locator("#status")).to_have_text("completed")
    history = page.locator("#thread-history .thread-run")
    expect(history).to_have_count(1)
    expect(history).to_contain_text("I am Ada")
    expect(history).to_contain_text("Nice to meet you, Ada.")
    page.locator("a#to-thread").click()
    expect(page).to_have_url(f"{live_site.url}/chamvi/threads/t-ada/")
    runs = page.locator(".thread-run")
    expect(runs).to_have_count(2)
    expect(runs.nth(0)).to_contain_text("I am Ada")
    expect(runs.nth(0)).to_contain_text("Nice to meet you, Ada.")
    expect(runs.nth(1)).to_contain_text("Who am I?")
    expect(runs.nth(1)).to_contain_text("You are Ada.")
    for n, run_id in enumerate((first, second)):
        expect(runs.nth(n).locator(f"a[href='/chamvi/runs/{run_id}/']")).to_have_count(1)
