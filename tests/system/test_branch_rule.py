"""The browser client computes a thread's current branch (``currentBranch`` and ``ThreadState`` in
client.js) by the rule the server applies (``chamvi_runs/core/branches.py``): a page that shows
another branch than the thread's JSON, or than the history the next run starts from, shows the user a
conversation the model never saw. Both are run on the same threads, every prefix of each (the branch
a page shows as the runs come), and must agree. Without Node the test is skipped (fails in CI), as
``tests/system/test_js_client.py``'s are."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from chamvi_runs.core.branches import Node, current_branch
from tests.system.test_js_client import ROOT, _tool

# Reads the threads on stdin; for each, the branch after each of its runs, computed twice: by
# currentBranch on the runs as JSON (run JSON, a thread's summaries), and by a ThreadState fed each
# run's run.start as the server sends it.
SCRIPT = """
import {ThreadState, currentBranch} from "./chamvi_runs/static/chamvi_runs/client.js";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = JSON.parse(input).map((runs) => {
  const state = new ThreadState("t");
  return runs.map((run, n) => {
    state.apply({type: "run.start", run_id: run.id, seq: 1, status: "running", replaced_by: null,
      replaces: run.replaces, forked_from: run.forked_from});
    return {json: currentBranch(runs.slice(0, n + 1)), state: [...state.branch]};
  });
});
process.stdout.write(JSON.stringify(out));
"""


def as_json(node: Node) -> dict[str, Any]:
    """A run's lineage as run.start and the run JSON say it (``serializers.lineage``)."""
    fork = None
    if node.forked_from is not None:
        # A fork after a step names that step (any index but -1 is the same to the rule).
        fork = {"run_id": node.forked_from, "step": -1 if node.from_start else 2}
    return {"id": node.id, "replaces": node.replaces, "forked_from": fork}


def plain(*ids: str) -> list[Node]:
    return [Node(i) for i in ids]


# The threads of tests/unit/test_core_branches.py, and the cases a chat page meets.
CASES: list[list[Node]] = [
    plain("a"),
    plain("a", "b", "c"),
    [*plain("a", "b", "c"), Node("c2", replaces="c")],
    [*plain("a", "b"), Node("b2", replaces="b"), Node("c")],
    [*plain("a", "b", "c", "d"), Node("b2", replaces="b"), Node("e")],
    [Node("a"), Node("a2", replaces="a")],
    [*plain("a", "b"), Node("b2", replaces="b"), Node("b3", replaces="b")],
    [*plain("a", "b"), Node("b2", replaces="b"), Node("b3", replaces="b2")],
    [*plain("a", "b", "c"), Node("f", forked_from="b")],
    [*plain("a", "b", "c"), Node("f", forked_from="b", from_start=True)],
    [*plain("a", "b"), Node("b2", replaces="b"), Node("f", forked_from="b2", from_start=True)],
    [*plain("a", "b"), Node("f", forked_from="elsewhere")],
    [*plain("a", "b"), Node("c", replaces="elsewhere")],
    [*plain("a", "b", "c"), Node("f", forked_from="a")],
    # A regenerate of a run off the branch switches back to its branch.
    [*plain("a", "b"), Node("a2", replaces="a"), Node("b2", replaces="b"), Node("c")],
]


def random_threads(count: int, seed: int = 19) -> list[list[Node]]:
    """Threads of up to 9 runs, each plain, a regenerate or resend of an earlier run, or a fork of
    one (after a step, or from its start), now and then of a run of another thread."""
    rng = random.Random(seed)
    threads = []
    for _ in range(count):
        runs: list[Node] = []
        for n in range(rng.randint(1, 9)):
            earlier = [r.id for r in runs] or ["elsewhere"]
            target = rng.choice([*earlier, "elsewhere"]) if rng.random() < 0.1 else rng.choice(earlier)
            kind = rng.random()
            if kind < 0.45 or not runs:
                runs.append(Node(f"r{n}"))
            elif kind < 0.75:
                runs.append(Node(f"r{n}", replaces=target))
            else:
                runs.append(Node(f"r{n}", forked_from=target, from_start=rng.random() < 0.5))
        threads.append(runs)
    return threads


def js_branches(threads: list[list[Node]]) -> list[list[dict[str, list[str]]]]:
    node = _tool("node")
    done = subprocess.run(
        [node, "--input-type=module", "-e", SCRIPT],
        cwd=ROOT,
        input=json.dumps([[as_json(n) for n in runs] for runs in threads]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(90)
def test_the_client_computes_every_threads_branch_as_the_server_does() -> None:
    threads = CASES + random_threads(400)
    computed = js_branches(threads)
    differ = []
    for runs, by_js in zip(threads, computed, strict=True):
        for n, js in enumerate(by_js):
            expected = current_branch(runs[: n + 1])
            if js["json"] != expected or js["state"] != expected:
                shown = [as_json(r) for r in runs[: n + 1]]
                differ.append(f"{json.dumps(shown)}: server {expected}, client {js}")
    assert not differ, f"{len(differ)} prefixes differ, e.g.:\n" + "\n".join(differ[:5])
    # The random threads hold every kind of run the rule tells apart.
    kinds = {(r.replaces is not None, r.forked_from is not None, r.from_start) for t in threads for r in t}
    assert kinds >= {(False, False, False), (True, False, False), (False, True, False), (False, True, True)}
