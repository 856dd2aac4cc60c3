"""A rolling deploy on real ``rqworker`` processes (SPEC §14): the old release of a site's agents
(``tests/deploy_site/v1.py``) and the new one (``v2.py``: same agent names, other tools and
instructions) execute side by side, then the old worker stops.

What a user of the site notices, run by run:

- a web process of the new release (a ``manage.py shell`` with the new agents) is up before any new
  worker: the run it starts waits, shown by the admin's stuck runs (reason ``version``); the old
  worker does not take it, nor does an old ``chamvi_tick`` still running move it to the old
  release; once a new worker is up, the janitor's next pass rings for it and it runs there;
- while both releases run, a run of the old release (approved, or just started by an old web
  process: this one) is executed by the old worker only, and a run the new release's web process
  starts by the new worker only, though each was offered to the other worker first (the other one
  was busy); the old refund runs once, with the old arguments;
- the old worker stops (SIGTERM) in the middle of a model call: that run is left ``interrupted``;
- old runs approved after that wait where the admin's stuck runs show them (reason ``version``),
  also after a ``chamvi_tick`` within the grace; after it, ``chamvi_tick`` (a process of the new
  release) moves each on as its agent's rule says: the desk's run goes on under the new release,
  where the refund a person approved no longer fits the tool (it needs a reason), so it does not run
  and the model is told; an archivist's run that archived fails ``agent_version_gone`` (the new
  release cannot archive), one that did not goes on; the custom agent's own rule keeps one run and
  fails the other; the interrupted run starts again under the new release;
- no effect runs twice (the effect tools count their executions in a file, beside ``EffectRecord``),
  none with arguments its tool rejects, and no run is ever ready to execute without either a live
  worker of its version or the stuck reason ``version``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import django_rq
import pytest
from django.db.models import Q
from django.utils import timezone
from rq.serializers import JSONSerializer

from chamvi_runs import approve, start_run, store
from chamvi_runs.agents.agent import registry
from chamvi_runs.conf import conf
from chamvi_runs.models import EffectRecord, Run, Step, WaitPoint, WorkerVersion
from chamvi_runs.store.queries import stuck_runs
from tests.support.helpers import events, first_user_block, logged_in, make_superuser
from tests.support.processes import ROOT, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, delay, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

AGENTS = ("deploy-desk", "deploy-archive", "deploy-custom")
SETTLED = ("completed", "failed", "cancelled")

SLOW_ORDER = 9
"""The old release thinks about this order until its worker is told to stop."""
BUSY_OLD, BUSY_NEW = 10, 11
"""The model holds the first call for these orders until the test lets it go: the worker executing
it (of the old release, or the new) is busy meanwhile (one run at a time), and takes no job."""


# --- the model: one responder per agent, answering from the run's messages --------------------------


def _payload(body: dict[str, Any]) -> str:
    """The run's trigger payload, from its first user message."""
    return str(first_user_block(body)["payload"])


def _release(body: dict[str, Any]) -> str:
    """Which release's instructions the request carries: "v1" or "v2"."""
    system = next(m["content"] for m in body["messages"] if m["role"] == "system")
    found = re.search(r"\((v[12])\)", system)
    assert found, system
    return found.group(1)


def _results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def _call(body: dict[str, Any], name: str, arguments: dict[str, Any]) -> Reply:
    call_id = f"call-{len(_results(body))}"
    return Reply(tool_call(call_id, name, json.dumps(arguments)), finish("tool_calls"))


def _done(body: dict[str, Any], result: str | None = None) -> Reply:
    """The final answer says which release gave it, and the last tool result it saw."""
    return Reply(text(f"{_release(body)} done: {result or _results(body)[-1]}"), finish("stop"))


def _number(pattern: str, body: dict[str, Any]) -> int:
    found = re.search(pattern, _payload(body))
    assert found, _payload(body)
    return int(found.group(1))


class Desk:
    """The desk's model: look the order up, then ask to refund 40 (with a reason under the new
    instructions). The busy orders' first call is held until ``let_go``; the slow order's, under the
    old release, streams a word and then thinks for 20 s."""

    def __init__(self) -> None:
        self.held = {BUSY_OLD: threading.Event(), BUSY_NEW: threading.Event()}

    def let_go(self, order: int | None = None) -> None:
        for number, event in self.held.items():
            if order in (None, number):
                event.set()

    def __call__(self, body: dict[str, Any]) -> Reply:
        order, results = _number(r"order (\d+)", body), _results(body)
        if order in self.held:
            self.held[order].wait(30)
            return _done(body, "held")
        if order == SLOW_ORDER and _release(body) == "v1":
            return Reply(text("Looking "), delay(20), text("it up."), finish("stop"))
        if not results:
            return _call(body, "lookup", {"order": order})
        if len(results) == 1:
            refund: dict[str, Any] = {"order": order, "amount": 40}
            if _release(body) == "v2":
                refund["reason"] = "damaged"
            return _call(body, "refund", refund)
        return _done(body)


def archive_turn(body: dict[str, Any]) -> Reply:
    """ "archive item N": archive it, then ask to confirm; "confirm item N": only ask to confirm."""
    plan: list[tuple[str, dict[str, Any]]] = [("confirm", {})]
    if _payload(body).startswith("archive"):
        plan.insert(0, ("archive", {"item": _number(r"item (\d+)", body)}))
    results = _results(body)
    return _call(body, *plan[len(results)]) if len(results) < len(plan) else _done(body)


def custom_turn(body: dict[str, Any]) -> Reply:
    """Ping, then ask to proceed."""
    plan: list[tuple[str, dict[str, Any]]] = [("ping", {}), ("proceed", {})]
    results = _results(body)
    return _call(body, *plan[len(results)]) if len(results) < len(plan) else _done(body)


# --- processes of each release -----------------------------------------------------------------------

NEW_WEB = """
import json, os, time
from pathlib import Path
from chamvi_runs import start_run
from chamvi_runs.agents.agent import registry
here = Path(os.environ["CHAMVI_TEST_WEB"])

def say(name, value):
    (here / (name + ".tmp")).write_text(json.dumps(value))
    (here / (name + ".tmp")).rename(here / name)

say("versions", registry.versions())
for n, payload in enumerate(json.loads(os.environ["CHAMVI_TEST_WEB_RUNS"])):
    while not (here / f"go-{n}").exists():
        time.sleep(0.02)
    say(f"run-{n}", start_run("deploy-desk", payload).pk)
"""
"""A web process of the new release (``manage.py shell -c``): it says its agents' versions, then
starts each run of ``$CHAMVI_TEST_WEB_RUNS`` once told to (``go-<n>`` in ``$CHAMVI_TEST_WEB``), and
says its id (``run-<n>``)."""


class Site:
    """The two releases' processes: ``worker(release)`` starts an ``rqworker`` of that release (one
    run at a time), ``manage(release, *args)`` runs a ``manage.py`` command of it, ``new_web`` starts
    the new release's web process. They record effects and rule calls in the test's files."""

    def __init__(self, base_url: str, files: Path) -> None:
        self.base_url = base_url
        self.effects = files / "effects.jsonl"
        self.rules = files / "rules.jsonl"
        self.web = files / "web"
        self.web.mkdir()
        self.workers: list[WorkerProcess] = []
        self.shells: list[subprocess.Popen[str]] = []

    def env(self, release: str, **extra: str) -> dict[str, str]:
        return worker_env(
            self.base_url,
            CHAMVI_TEST_DEPLOY=release,
            CHAMVI_TEST_DEPLOY_SINK=str(self.effects),
            CHAMVI_TEST_DEPLOY_RULES=str(self.rules),
            CHAMVI_CONCURRENCY="1",
            **extra,
        )

    def worker(self, release: str) -> WorkerProcess:
        worker = WorkerProcess(self.env(release))
        self.workers.append(worker)
        return worker

    def manage(self, release: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(release),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)} ({release}):\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def new_web(self, payloads: list[str]) -> subprocess.Popen[str]:
        shell = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", NEW_WEB],
            cwd=ROOT,
            env=self.env("v2", CHAMVI_TEST_WEB=str(self.web), CHAMVI_TEST_WEB_RUNS=json.dumps(payloads)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.shells.append(shell)
        return shell

    def said(self, name: str) -> Any:
        path = self.web / name
        return json.loads(path.read_text()) if path.exists() else None

    def start_on_new_web(self, shell: subprocess.Popen[str], n: int) -> Run:
        """The new web process starts its ``n``-th run."""
        (self.web / f"go-{n}").touch()
        wait_for(
            lambda: self.said(f"run-{n}") or shell.poll() is not None,
            30,
            f"the new web process to start run {n}",
        )
        assert self.said(f"run-{n}"), shell.communicate()[0]
        return Run.objects.get(pk=self.said(f"run-{n}"))

    def shell_output(self, shell: subprocess.Popen[str]) -> str:
        return "(still running)" if shell.poll() is None else str(shell.communicate()[0])

    def logs(self) -> str:
        return "\n".join(f"--- worker {w.pid}\n{w.output()[-2500:]}" for w in self.workers)

    def effect_lines(self) -> list[dict[str, Any]]:
        return _lines(self.effects)

    def rule_lines(self) -> list[dict[str, Any]]:
        return _lines(self.rules)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def desk(server: Any) -> Iterator[Desk]:
    desk = Desk()
    server.respond("m-deploy-desk", desk)
    server.respond("m-deploy-archive", archive_turn)
    server.respond("m-deploy-custom", custom_turn)
    yield desk
    desk.let_go()  # no request of the scripted server's stays held


@pytest.fixture
def site(server: Any, tmp_path: Path) -> Iterator[Site]:
    site = Site(server.base_url, tmp_path)
    yield site
    for shell in site.shells:
        if shell.poll() is None:
            shell.kill()
        shell.communicate()
    for worker in site.workers:
        worker.stop()


# --- what the database says -------------------------------------------------------------------------


def _run(run: Run | str) -> Run:
    return Run.objects.get(pk=run if isinstance(run, str) else run.pk)


def _llm_versions(run: Run | str) -> list[Any]:
    """The version that made each of the run's model calls, in order."""
    steps = Step.objects.filter(run=_run(run), kind="llm").order_by("index")
    return [(s.input or {}).get("version") for s in steps]


def _approval(run: Run | str) -> str:
    return WaitPoint.objects.get(run=_run(run), decision__isnull=True).approval_id


def _waits_for_version() -> set[str]:
    """The runs the admin's stuck runs list because no live worker has their version."""
    stuck = stuck_runs(Run.objects.filter(agent__in=AGENTS), timedelta(minutes=10))
    return {r.pk for r in stuck if cast(Any, r).stuck_reason == "version"}  # an annotation


def _live_versions() -> set[tuple[str, str]]:
    return {(agent, version) for agent, versions in store.live_versions().items() for version in versions}


def _rows_of(worker: WorkerProcess) -> Any:
    """The worker's WorkerVersion rows (its name is host:pid:nonce)."""
    return WorkerVersion.objects.filter(worker__contains=f":{worker.pid}:")


READY = Q(status__in=["queued", "interrupted"]) | Q(status="running", claim_owner__isnull=True)


def _unexplained() -> list[str]:
    """Runs ready to execute that no live worker can take and the stuck runs do not show: what a
    user would find left without a reason (expected: none)."""
    live, waiting = _live_versions(), _waits_for_version()
    agents_live = {agent for agent, _ in live}
    return [
        f"{r.pk} {r.agent}@{r.agent_version or '-'} {r.status}"
        for r in Run.objects.filter(READY, agent__in=AGENTS)
        if not (
            (r.agent, r.agent_version) in live
            or (r.agent_version == "" and r.agent in agents_live)
            or r.pk in waiting
        )
    ]


def _states(runs: dict[str, Run]) -> str:
    lines = []
    for label, run in runs.items():
        row = _run(run)
        lines.append(
            f"{label}: {row.status} {row.agent}@{row.agent_version} {row.error_code} "
            f"{row.error_message[:200]} llm={_llm_versions(row)}"
        )
    return "\n".join(lines)


# --- the deploy --------------------------------------------------------------------------------------


def test_a_rolling_deploy_moves_every_run_on_as_its_agents_rule_says(server, desk, site):
    # This process is a web process of the old release.
    assert "(v1)" in str(registry.get("deploy-desk").instructions)
    v1 = {name: registry.get(name).version for name in AGENTS}
    runs: dict[str, Run] = {}

    def explain(what: str) -> Callable[[], str]:
        return lambda: f"{what}\n{_states(runs)}\n{site.logs()}"

    def settle(*labels: str) -> None:
        wait_for(
            lambda: all(_run(runs[label]).status in SETTLED for label in labels),
            30,
            explain(f"{', '.join(labels)} to settle"),
        )

    def waiting(*labels: str) -> None:
        wait_for(
            lambda: all(_run(runs[label]).status == "waiting" for label in labels),
            30,
            explain(f"{', '.join(labels)} to wait for approval"),
        )

    def asked(label: str, model: str = "m-deploy-desk") -> list[dict[str, Any]]:
        """The requests the run's model calls made."""
        return [b for b in server.requests_for(model) if _payload(b) == runs[label].trigger["payload"]]

    def nothing_unexplained() -> None:
        assert _unexplained() == [], explain("runs ready with no worker and no reason")()

    # Before the deploy: only the old release runs. Its runs reach their approvals.
    old = site.worker("v1")
    runs["s1"] = start_run("deploy-desk", "refund order 1")
    runs["s3"] = start_run("deploy-desk", "refund order 3")
    runs["archived"] = start_run("deploy-archive", "archive item 4")
    runs["unarchived"] = start_run("deploy-archive", "confirm item 6")
    runs["keep"] = start_run("deploy-custom", "keep 7")
    runs["drop"] = start_run("deploy-custom", "drop 8")
    waiting(*runs)
    for label, run in runs.items():
        assert _run(run).agent_version == v1[run.agent], label
        assert set(_llm_versions(run)) == {v1[run.agent]}, label
    assert [e["args"] for e in site.effect_lines()] == [{"item": 4}]  # archived's archive, on v1
    nothing_unexplained()

    # The deploy starts with the web: a web process of the new release says its agents' versions and
    # starts a run before any worker of the new release is up. The old worker leaves it alone (it
    # drops the job), and the run shows as waiting for its version; an old chamvi_tick, still
    # running, leaves it alone too: it is no old run whose version is gone.
    web = site.new_web(["refund order 12", f"refund order {BUSY_NEW}", "refund order 2"])
    wait_for(lambda: site.said("versions"), 30, lambda: f"the new web process\n{site.shell_output(web)}")
    v2 = {name: site.said("versions")[name] for name in AGENTS}
    assert all(v1[name] != v2[name] for name in AGENTS), (v1, v2)
    runs["early"] = site.start_on_new_web(web, 0)
    assert runs["early"].agent_version == v2["deploy-desk"]
    wait_for(
        lambda: runs["early"].pk in _waits_for_version() and runs["early"].pk in old.output(),
        15,
        explain("the new run to wait for a worker of its version"),
    )
    # The old worker says why, and what may be wrong: no worker ever had that version.
    assert "which no worker has ever had" in old.output(), old.output()
    nothing_unexplained()
    ticked = site.manage("v1", "chamvi_tick", "--once")
    early = _run(runs["early"])
    assert early.agent_version == v2["deploy-desk"] and _llm_versions(early) == [], explain(
        f"an old chamvi_tick to leave the new release's run alone; it said: {ticked}"
    )()
    assert early.pk in _waits_for_version()

    # Then a worker of the new release starts beside the old one. The new run's job was dropped: the
    # janitor's next pass rings for it (a run quiet for a lease, as any lost job).
    new = site.worker("v2")
    wait_for(
        lambda: new.ready() and _rows_of(new).filter(stopped_at__isnull=True).exists(),
        30,
        explain("the new worker to say which versions it has"),
    )
    assert dict(_rows_of(new).filter(agent__in=AGENTS).values_list("agent", "version")) == v2
    nothing_unexplained()
    lease = timedelta(seconds=conf.LEASE_SECONDS)
    wait_for(lambda: _run(runs["early"]).updated_at < timezone.now() - lease, 15, "the new run to be quiet")
    site.manage("v2", "chamvi_tick", "--once")
    waiting("early")

    # 1. While both releases run, old runs go to the old worker only. It is busy (its model call is
    # held): the new worker is offered the approved old run and one this process starts, and leaves
    # both to it.
    runs["busy_old"] = start_run("deploy-desk", f"refund order {BUSY_OLD}")
    wait_for(lambda: asked("busy_old"), 30, explain("the old worker to be busy"))
    approve(_approval(runs["s1"]))
    runs["s1b"] = start_run("deploy-desk", "refund order 5")
    try:
        wait_for(
            lambda: runs["s1"].pk in new.output() and runs["s1b"].pk in new.output(),
            10,
            explain("the new worker to be offered the old runs"),
        )
    finally:
        desk.let_go(BUSY_OLD)
    settle("busy_old", "s1")
    waiting("s1b")
    # 2. And the other way round: the new worker is busy, the old one is offered the run the new
    # release's web process starts, and leaves it to the new one.
    runs["busy_new"] = site.start_on_new_web(web, 1)
    wait_for(lambda: asked("busy_new"), 30, explain("the new worker to be busy"))
    runs["s2"] = site.start_on_new_web(web, 2)
    try:
        wait_for(lambda: runs["s2"].pk in old.output(), 10, explain("the old worker to be offered s2"))
    finally:
        desk.let_go(BUSY_NEW)
    settle("busy_new")
    waiting("s2")
    nothing_unexplained()
    approve(_approval(runs["s2"]))
    approve(_approval(runs["s1b"]))
    approve(_approval(runs["early"]))
    settle("s2", "s1b", "early")
    nothing_unexplained()

    for label, release, versions, calls in (
        ("s1", "v1", v1, 3),
        ("s1b", "v1", v1, 3),
        ("busy_old", "v1", v1, 1),
        ("s2", "v2", v2, 3),
        ("busy_new", "v2", v2, 1),
        ("early", "v2", v2, 3),
    ):
        run = _run(runs[label])
        assert run.status == "completed", explain(label)()
        assert run.agent_version == versions["deploy-desk"], label
        assert _llm_versions(run) == [versions["deploy-desk"]] * calls, label
        assert str(run.output).startswith(f"{release} done: "), (label, run.output)
        # Every model call of the run carried its own release's instructions.
        assert {_release(b) for b in asked(label)} == {release}, label
    refunds = {e["run"]: e for e in site.effect_lines() if e["tool"] == "refund"}
    assert refunds[runs["s1"].pk]["args"] == {"order": 1, "amount": 40}
    assert refunds[runs["s1"].pk]["release"] == "v1"
    assert refunds[runs["s1b"].pk]["args"] == {"order": 5, "amount": 40}
    assert refunds[runs["s2"].pk]["args"] == {"order": 2, "amount": 40, "reason": "damaged"}
    assert refunds[runs["s2"].pk]["release"] == "v2"

    # The old worker stops, as a deploy stops it, in the middle of a model call.
    runs["inflight"] = start_run("deploy-desk", f"refund order {SLOW_ORDER}")
    wait_for(
        lambda: any(e["type"] == "delta" for e in events(runs["inflight"])),
        30,
        explain("the old release to start answering the slow order"),
    )
    assert old.stop_gracefully(30) == 0, old.output()
    gone = _rows_of(old)
    assert gone.exists() and not gone.filter(stopped_at__isnull=True).exists()
    assert not any(version in v1.values() for _, version in _live_versions())
    assert _run(runs["inflight"]).status == "interrupted", explain("inflight")()
    nothing_unexplained()

    # 3, 4. Old runs approved now: no worker has their version. They wait where the admin shows
    # them, with the one the old worker left interrupted.
    approved = ["s3", "archived", "unarchived", "keep", "drop"]
    moved = [*approved, "inflight"]
    for label in approved:
        approve(_approval(runs[label]))
    wait_for(
        lambda: {runs[label].pk for label in moved} <= _waits_for_version(),
        15,
        explain("the approved old runs to show as waiting for their version"),
    )
    nothing_unexplained()
    page = logged_in(make_superuser("operator")).get("/admin/chamvi_runs/stuckrun/").content.decode()
    for label in moved:
        assert runs[label].pk in page, label
    assert page.count("which no live worker has") == len(moved), page
    # Their jobs were taken from the queue by the new worker and dropped, not executed.
    queue = django_rq.get_queue("chamvi", serializer=JSONSerializer)
    wait_for(lambda: queue.count == 0, 15, explain("the new worker to drop the old runs' jobs"))
    for label in moved:
        run = _run(runs[label])
        assert run.status not in SETTLED and run.agent_version == v1[run.agent], label
        assert set(_llm_versions(run)) <= {v1[run.agent]}, label  # inflight's call was not saved

    # Within the grace, chamvi_tick of the new release leaves them alone.
    ticked = site.manage("v2", "chamvi_tick", "--once")
    assert "moved" not in ticked, ticked
    for label in moved:
        run = _run(runs[label])
        assert run.status not in SETTLED and run.agent_version == v1[run.agent], label
    assert {runs[label].pk for label in moved} <= _waits_for_version()
    assert site.rule_lines() == []
    nothing_unexplained()

    # The grace is over (the old worker was last seen ten minutes ago): the rules move them on.
    ago = timezone.now() - timedelta(minutes=10)
    WorkerVersion.objects.filter(version__in=v1.values(), stopped_at__isnull=False).update(
        started_at=ago - timedelta(minutes=5), seen_at=ago, stopped_at=ago
    )
    ticked = site.manage("v2", "chamvi_tick", "--once")
    # s3, unarchived, keep and inflight go on; archived and drop fail.
    assert re.search(r"moved 4 run.*failed 2\b", ticked), ticked
    settle(*approved)
    waiting("inflight")
    nothing_unexplained()
    approve(_approval(runs["inflight"]))
    settle("inflight")
    nothing_unexplained()

    # 3. The desk's run went on under the new release; the refund a person approved for
    # (order, amount) does not fit the new refund (it needs a reason): it did not run, and the model
    # was told so.
    s3 = _run(runs["s3"])
    assert s3.status == "completed", explain("s3")()
    assert s3.agent_version == v2["deploy-desk"]
    assert _llm_versions(s3) == [v1["deploy-desk"], v1["deploy-desk"], v2["deploy-desk"]]
    refund_step = Step.objects.get(run=s3, kind="tool", name="refund")
    assert refund_step.output is None and "reason" in refund_step.error, refund_step.error
    assert not EffectRecord.objects.filter(run=s3).exists()
    last = asked("s3")[-1]
    assert _release(last) == "v2"
    told = _results(last)[-1]
    assert "reason" in told and "refund" in told, told
    assert s3.output == f"v2 done: {told}"

    # 4. The archivist's run that archived cannot go on (archive is gone); the other one goes on.
    archived = _run(runs["archived"])
    assert (archived.status, archived.error_code) == ("failed", "agent_version_gone"), explain("archived")()
    assert "'archive'" in archived.error_message, archived.error_message
    assert set(_llm_versions(archived)) == {v1["deploy-archive"]}
    assert EffectRecord.objects.filter(run=archived, tool_name="archive").count() == 1
    unarchived = _run(runs["unarchived"])
    assert unarchived.status == "completed", explain("unarchived")()
    assert unarchived.agent_version == v2["deploy-archive"]
    assert _llm_versions(unarchived) == [v1["deploy-archive"], v2["deploy-archive"]]
    assert unarchived.output == "v2 done: confirmed"

    # The custom agent's rule kept the run that asked to be kept and failed the other.
    keep, drop = _run(runs["keep"]), _run(runs["drop"])
    assert keep.status == "completed" and keep.agent_version == v2["deploy-custom"], explain("keep")()
    assert _llm_versions(keep) == [v1["deploy-custom"], v1["deploy-custom"], v2["deploy-custom"]]
    assert keep.output == "v2 done: proceeding"
    assert (drop.status, drop.error_code) == ("failed", "agent_version_gone"), explain("drop")()
    assert drop.error_message, "a failed run says why"
    assert set(_llm_versions(drop)) == {v1["deploy-custom"]}
    told_rule = {line["run"]: line for line in site.rule_lines()}
    assert set(told_rule) == {keep.pk, drop.pk}
    for line in told_rule.values():
        assert (line["old"], line["new"]) == (v1["deploy-custom"], v2["deploy-custom"])
        assert "ping" in line["called"]

    # The run the old worker left in the middle of its first model call started again under the new
    # release (the default rule: it had called no tool), and refunded with a reason.
    inflight = _run(runs["inflight"])
    assert inflight.status == "completed", explain("inflight")()
    assert inflight.agent_version == v2["deploy-desk"]
    assert _llm_versions(inflight) == [v2["deploy-desk"]] * 3

    # No effect ran twice, none with arguments its tool rejects: each execution is one EffectRecord.
    effects = site.effect_lines()
    assert sorted((e["run"], e["tool"]) for e in effects) == sorted(
        [
            (runs["s1"].pk, "refund"),
            (runs["s1b"].pk, "refund"),
            (runs["s2"].pk, "refund"),
            (runs["early"].pk, "refund"),
            (runs["archived"].pk, "archive"),
            (runs["inflight"].pk, "refund"),
        ]
    )
    refunds = {e["run"]: e for e in effects if e["tool"] == "refund"}
    assert refunds[runs["inflight"].pk]["args"] == {"order": SLOW_ORDER, "amount": 40, "reason": "damaged"}
    records = EffectRecord.objects.filter(run__agent__in=AGENTS)
    assert sorted(records.values_list("run_id", "key")) == sorted((e["run"], e["key"]) for e in effects)
    for record in records.filter(tool_name="refund"):
        release = next(e["release"] for e in effects if e["key"] == record.key)
        expected = {"order", "amount", "reason"} if release == "v2" else {"order", "amount"}
        assert set(record.input or ()) == expected, (record.input, release)

    # Every run settled; each failed one with its reason.
    for run in Run.objects.filter(agent__in=AGENTS):
        assert run.status in SETTLED, _states(runs)
        assert run.status != "failed" or run.error_code == "agent_version_gone", run.error_message
    nothing_unexplained()
