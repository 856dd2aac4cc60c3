"""The JavaScript client of docs/streaming.md, taken from the docs and run in headless Chromium against
the live site: it starts a run with the session, steers it over the socket, survives a dropped
connection by resuming after its last seq, and renders the run to its end."""

from __future__ import annotations

import pytest

from chamvi_runs.models import Step
from tests.browser.flows import script_refund
from tests.docsamples import block
from tests.scripted_server import Reply, finish, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

FOLLOW = """async () => {
  const run = await startRun("support", {message: "Order A-1001 arrived broken."});
  const seqs = [], replies = [], resumes = [];
  let dropped = false, waiting = null;
  // The connection drops once the run waits and the input's ack is in (a socket closed earlier
  // would lose the ack, not the input); the run is approved meanwhile: the client resumes after
  // its last seq.
  function dropAndApprove() {
    if (dropped || !waiting || !replies.some((r) => r.type === "ack")) return;
    dropped = true;
    window.__sockets.at(-1).close();
    const csrf = document.cookie.match(/(?:^|; )csrftoken=([^;]*)/)[1];
    fetch(`/chamvi/api/approvals/${waiting.approval_id}/approve/`, {
      method: "POST", headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
      body: JSON.stringify({reason: "photos checked"}),
    });
  }
  return await new Promise((resolve) => {
    const follower = followRun(run.id, {
      onEvent(view, event) {
        seqs.push(event.seq);
        if (event.type === "run.start") follower.send({type: "input", payload: "The box was damaged too."});
        if (event.type === "run.resume") resumes.push(event);
        if (event.type === "run.waiting") { waiting = event; dropAndApprove(); }
        if (event.type === "run.end") resolve({
          id: run.id, seqs, replies, resumes, status: view.status, output: view.end.output,
          waiting: view.waiting, sockets: window.__sockets.length,
          steps: [...view.steps.entries()].map(([step, shown]) => [step, shown.attempt, shown.text]),
          tools: view.tools.map((e) => [e.type, e.name || e.input_id]),
        });
      },
      onReply(reply) { replies.push(reply); dropAndApprove(); },
    });
  });
}"""


def test_the_docs_client_follows_a_run_through_a_dropped_socket_to_its_end(page, server):
    script_refund(server, Reply(text("Refunded, "), text("anything else?"), finish("stop")))
    page.add_script_tag(content=block("streaming-js-client"))
    seen = page.evaluate(FOLLOW)

    assert seen["status"] == "completed" and seen["waiting"] is None
    assert seen["output"] == "Refunded, anything else?"
    # Every event once, in order, across two sockets.
    assert seen["sockets"] >= 2
    assert seen["seqs"] == list(range(1, len(seen["seqs"]) + 1))
    (ack,) = [r for r in seen["replies"] if r["type"] == "ack"]
    assert ack["action"] == "input"
    assert ["input", ack["input_id"]] in seen["tools"]
    assert ["tool.result", "issue_refund"] in seen["tools"]
    (resume,) = seen["resumes"]
    assert resume["decision"]["decision"] == "approved" and resume["decision"]["decided_by"] == "alice"
    # What the client rendered is what the run stored: the highest attempt of each model step.
    stored = {
        s.index: (s.attempt, s.output["text"]) for s in Step.objects.filter(run_id=seen["id"], kind="llm")
    }
    assert {step: (attempt, shown) for step, attempt, shown in seen["steps"]} == stored
