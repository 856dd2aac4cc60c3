"""A worker SIGKILLed around the save of a run's second model call, the first save that stores only
the messages its steps added (SPEC §12): the run is recovered with the history the model would have
had, each message once."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from chamvi_runs import start_run
from chamvi_runs.models import Checkpoint, Run, Step
from tests.integration.test_history_parts import added, expected_histories, turns
from tests.support.scripted_server import Reply
from tests.system.faults.harness import recover, violations

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

MODEL = "m-basic"
EXTRA = 19
# The steps of the first two saves: a model call and its 20 tool calls, then one with 21.
FIRST_SAVE = EXTRA + 1
SECOND_SAVE = FIRST_SAVE + 1 + EXTRA + 2


class Armed:
    """Answers each call by how far its history got (a repeated call gets the same reply), and
    arms the crash point, by removing its marker, when the second model call comes."""

    def __init__(self, marker: Any) -> None:
        self.marker = marker
        # 20 calls a turn: from the second save on, the history is long (``WHOLE_UNTIL``), and a
        # save stores its steps' messages only.
        self.replies = turns(3, extra=EXTRA)
        self.requests: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append(body["messages"][1:])
            answered = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if answered == 1:
                self.marker.unlink(missing_ok=True)
            return self.replies[answered]


def _no_message_twice(history: list[dict[str, Any]]) -> None:
    calls = [c["id"] for m in history if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in history if m["role"] == "tool"]
    assert len(calls) == len(set(calls)) and sorted(results) == sorted(calls), history
    assert sum(1 for m in history if m["role"] == "user") == 1


@pytest.mark.parametrize("point", ["after_step_commit", "before_step_commit"])
def test_a_worker_killed_at_the_save_of_a_later_step_resumes_with_the_right_history(
    point, server, audit, pool
):
    marker = pool.marker / point
    marker.touch()  # disarmed until the second model call
    model = Armed(marker)
    server.respond(MODEL, model)
    doomed = pool.spawn(crash_at=point)
    run = start_run("basic", "add things up")
    doomed.wait(60)
    assert doomed.proc.returncode == -9, f"the worker did not crash at {point}:\n{doomed.output()[-3000:]}"

    crashed = Checkpoint.objects.get(run=run)
    if point == "after_step_commit":
        # The second save stored its steps' messages and moved the checkpoint, not the whole history.
        assert crashed.step_index == SECOND_SAVE and crashed.whole_step == FIRST_SAVE
        # The first save's steps keep counts (the whole history holds them), the second's their parts.
        parts = [s.messages for s in Step.objects.filter(run=run).order_by("index")]
        assert parts[: FIRST_SAVE + 1] == [2, *[1] * FIRST_SAVE]
        assert [len(part) for part in parts[FIRST_SAVE + 1 :]] == [1] * (SECOND_SAVE - FIRST_SAVE)
        before_crash = crashed.history()
    else:
        # Nothing of the second save was committed.
        assert crashed.step_index == FIRST_SAVE and crashed.whole_step == FIRST_SAVE
        before_crash = model.requests[1]
    assert len(model.requests) == 2

    recover([run.pk], pool)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "completed" and run.output == "Done.", (run.error_code, run.error_message)
    assert run.attempt == 2
    requests = model.requests
    if point == "after_step_commit":
        # The saved call is not made again; the next call is sent the history as it was saved.
        assert len(requests) == 4
        assert requests[2] == before_crash
    else:
        # The unsaved call is made again, with the same history.
        assert len(requests) == 5 and requests[2] == requests[1] == before_crash
        requests = [*requests[:2], *requests[3:]]
    # Each call was sent the history before it, plus the previous answer and its results.
    for earlier, later in itertools.pairwise(requests):
        assert later[: len(earlier)] == earlier
    for request in requests:
        _no_message_twice(request)
    steps = list(Step.objects.filter(run=run).order_by("index"))
    tools = [EXTRA + 1, EXTRA + 2, EXTRA + 1]
    assert [s.kind for s in steps] == [kind for n in tools for kind in ["llm", *["tool"] * n]] + ["llm"]
    final = Checkpoint.objects.get(run=run)
    assert final.messages == [*requests[-1], {"role": "assistant", "content": "Done."}]
    _no_message_twice(final.messages)
    assert final.messages == [m for part in added(run) for m in part]
    for index, history in expected_histories(run, requests).items():
        assert final.history(index) == history, f"the history after step {index}"
    assert json.dumps(final.messages).count('"tool_call_id": "c1b"') == 1
    assert violations() == []
