"""Several hosts for real: PostgreSQL + Redis, the web process (daphne and chamvi_tick) and two
workers, each in a network namespace of its own, joined by a data switch; the workers reach the
model (served by this test process, host ``ctl``) over a second switch.

::

    data 10.213.k.0/24      db .10 (PostgreSQL, Redis)   web .30 (daphne, chamvi_tick)
                            w1 .41   w2 .42   ctl .1 (this process: HTTP API calls, SQL reads)
    model 10.214.k.0/24     w1 .41   w2 .42   ctl .1 (the scripted model)

Runs started over HTTP on the web host run end to end on both workers, watched by a websocket
client on the web host. Then the worker executing a run loses its cable to the data switch in the
middle of a model call (silently: its packets are dropped, its connections hang): its lease
expires, chamvi_tick on the web host re-enqueues the run, the other worker resumes it from the
checkpoint and finishes it. When the cable is back, the cut-off worker's late writes are refused:
nothing is written twice, the effect ran once, and the cut-off worker takes new runs again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.docsamples import block
from tests.support.processes import answers, wait_for
from tests.support.scripted_server import Reply, ScriptedServer, delay, finish, text, tool_call, usage
from tests.system.multihost.netns import Host, Lan, available
from tests.system.multihost.services import start_postgres, start_redis

ROOT = Path(__file__).resolve().parents[3]
MODEL = "m-basic"  # the test app's agent "basic": tools add, refund (an effect tool), ...
WEB_PORT = 8000

pytestmark = pytest.mark.timeout(300)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@dataclass
class Site:
    lan: Lan
    db: Host
    web: Host
    workers: dict[str, Host]
    model: ScriptedServer
    dsn: str
    token: str
    cookie: str

    @property
    def web_url(self) -> str:
        return f"http://{self.web.addresses['data']}:{WEB_PORT}"

    def log(self, name: str) -> str:
        return (self.lan.workdir / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in ("web", "tick", "w1", "w2"))

    def start_run(self, payload: str) -> str:
        request = urllib.request.Request(
            f"{self.web_url}/chamvi/api/runs/",
            data=json.dumps({"agent": "basic", "payload": payload}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
            return str(json.loads(response.read())["id"])

    def watch(self, run_ids: list[str]) -> subprocess.Popen[str]:
        """A browser on the web host following the runs over websockets (tests/system/multihost/watch.py)."""
        argv = [
            sys.executable,
            "-m",
            "tests.system.multihost.watch",
            str(WEB_PORT),
            self.cookie,
            "60",
            *run_ids,
        ]
        return subprocess.Popen(
            self.web.command(argv),
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(query, args).fetchall()

    def env(self) -> dict[str, str]:
        db = self.db.addresses["data"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CHAMVI_", "DJANGO_", "OPENAI_"))}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=f"postgres://postgres@{db}:5432/chamvi_multihost",
            REDIS_URL=f"redis://{db}:6379/0",
            OPENAI_BASE_URL=self.model.base_url,
            OPENAI_API_KEY="test",
            DJANGO_ALLOWED_HOSTS=f"{self.web.addresses['data']},127.0.0.1,localhost",
            CHAMVI_TEST_MEDIA=str(self.lan.workdir / "media"),
            PYTHONUNBUFFERED="1",
        )
        return env


def procfile_commands() -> dict[str, list[str]]:
    """The processes of the Procfile in docs/deployment.md, with this venv's Python."""
    commands = {}
    for line in block("deployment-procfile").splitlines():
        if line.strip():
            name, command = line.split(":", 1)
            argv = shlex.split(command)
            head = [sys.executable] if argv[0] == "python" else [sys.executable, "-m", argv[0]]
            commands[name] = [*head, *argv[1:]]
    assert set(commands) == {"web", "worker", "tick"}, commands
    assert f"{WEB_PORT}" in commands["web"], commands["web"]
    return commands


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    missing = available()
    if missing:
        if _in_ci():
            pytest.fail(f"the multi-host test must run in CI: {missing}", pytrace=False)
        pytest.skip(missing)
    with Lan() as lan:
        db = lan.add_host("db", 10, ["data"])
        web = lan.add_host("web", 30, ["data"])
        workers = {
            name: lan.add_host(name, last, ["data", "model"]) for name, last in (("w1", 41), ("w2", 42))
        }
        start_postgres(db, lan.workdir)
        start_redis(db, lan.workdir)
        server = f"postgresql://postgres@{db.addresses['data']}:5432"
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE chamvi_multihost")
        with ScriptedServer(host=lan.ctl["model"]) as model:
            site = Site(lan, db, web, workers, model, f"{server}/chamvi_multihost", "", "")
            env = site.env()
            manage = [sys.executable, "manage.py"]
            web.run([*manage, "migrate", "--no-input", "--run-syncdb"], env=env, cwd=ROOT, timeout=180)
            credentials = json.loads(
                web.run([sys.executable, "-m", "tests.system.multihost.site"], env=env, cwd=ROOT, timeout=60)
            )
            site.token, site.cookie = credentials["token"], credentials["cookie"]
            # The commands of the Procfile in docs/deployment.md, on their hosts; the janitor at a
            # shorter interval than its default, so that the test waits less for it.
            procfile = procfile_commands()
            web.start(procfile["web"], env=env, cwd=ROOT, log=lan.workdir / "web.log")
            web.start(
                [*procfile["tick"], "--interval", "0.5"], env=env, cwd=ROOT, log=lan.workdir / "tick.log"
            )
            for name, worker in workers.items():
                worker.start(procfile["worker"], env=env, cwd=ROOT, log=lan.workdir / f"{name}.log")
            wait_for(lambda: answers(site.web_url + "/"), 60, site.logs)
            wait_for(lambda: all("Listening on" in site.log(n) for n in workers), 60, site.logs)
            yield site


def _events_in_order(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of a socket's messages, checked to carry every seq once, in order."""
    events = [m for m in messages if "seq" in m]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    return events


def _watched(process: subprocess.Popen[str]) -> dict[str, list[dict[str, Any]]]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return dict(json.loads(out))


def test_runs_cross_hosts_and_a_worker_cut_off_from_the_database_loses_its_run_to_the_other(
    site: Site,
) -> None:
    # --- runs end to end across the hosts, on both workers -------------------------------------
    site.model.script(
        MODEL, [Reply(delay(0.5), text("hello "), text("across hosts"), finish("stop"), usage(8, 3))] * 6
    )
    runs = [site.start_run(f"hello {n}") for n in range(6)]
    watched = _watched(site.watch(runs))
    for run_id in runs:
        events = _events_in_order(watched[run_id])
        end = events[-1]
        assert end["type"] == "run.end" and end["status"] == "completed", end
        assert "".join(e["text"] for e in events if e["type"] == "delta") == "hello across hosts"
    statuses = site.sql("SELECT status, output FROM chamvi_runs_run WHERE id = ANY(%s)", runs)
    assert statuses == [("completed", "hello across hosts")] * 6
    # A worker that is busy takes no job (one run at a time), so the other took some of them.
    for name in site.workers:
        assert any(r in site.log(name) for r in runs), f"{name} executed none of the runs:\n{site.logs()}"

    # --- one worker is cut off from the database in the middle of a model call ------------------
    site.model.script(
        MODEL,
        [
            Reply(
                tool_call("c1", "refund", '{"order_id": "A-1", "amount_cents": 500}'),
                finish("tool_calls"),
                usage(10, 5),
            ),
            # The call during which the executing worker loses the database: it ends during the
            # cut, and the worker's save of its step hangs until the cable is back.
            Reply(text("Refunding"), delay(2.5), text(" A-1 now."), finish("stop"), usage(12, 4)),
            # The same call, made again by the worker that resumes the run.
            Reply(text("Refund of A-1 "), text("is done."), finish("stop"), usage(12, 5)),
        ],
    )
    run_id = site.start_run("refund order A-1")
    browser = site.watch([run_id])
    owner = wait_for(
        lambda: site.sql("SELECT claim_owner FROM chamvi_runs_run WHERE id = %s AND model_calls = 2", run_id),
        30,
        site.logs,
    )[0][0]
    holder = site.workers[owner.split(":")[0]]
    other = next(w for w in site.workers.values() if w is not holder)
    site.lan.unplug(holder)
    cut = time.monotonic()
    try:
        wait_for(
            lambda: site.sql("SELECT 1 FROM chamvi_runs_run WHERE id = %s AND status = 'completed'", run_id),
            60,
            site.logs,
        )
        attempt, claim_owner = site.sql(
            "SELECT attempt, claim_owner FROM chamvi_runs_run WHERE id = %s", run_id
        )[0]
        assert attempt == 2 and claim_owner is None
        resumed = time.monotonic() - cut
    finally:
        site.lan.plug(holder)
    # Back on the network, the cut-off worker's save of its step arrives, past its lease: refused.
    lost = re.compile(rf"{run_id}.*claim lost before saving steps")
    wait_for(lambda: lost.search(site.log(holder.name)), 90, site.logs)
    refused = time.monotonic() - cut
    print(
        f"cut {holder.name} off; {other.name} completed the run {resumed:.1f} s later; "
        f"the late write was refused {refused:.1f} s after the cut"
    )

    steps = site.sql(
        "SELECT index, kind, attempt, output FROM chamvi_runs_step WHERE run_id = %s ORDER BY index", run_id
    )
    assert [(i, k, a) for i, k, a, _ in steps] == [(0, "llm", 1), (1, "tool", 1), (2, "llm", 2)]
    assert steps[2][3]["text"] == "Refund of A-1 is done."
    assert site.sql("SELECT status, output FROM chamvi_runs_run WHERE id = %s", run_id) == [
        ("completed", "Refund of A-1 is done.")
    ]
    # The effect ran once, on the worker that was cut off later; nobody ran it again.
    assert site.sql("SELECT count(*) FROM testapp_refund WHERE order_id = 'A-1'") == [(1,)]
    assert site.sql("SELECT count(*) FROM chamvi_runs_effectrecord WHERE run_id = %s", run_id) == [(1,)]
    assert len(site.model.requests_for(MODEL)) == 6 + 3
    assert run_id in site.log(other.name)

    # The browser on the web host saw the resume, and one end: the resumed execution's answer.
    events = _events_in_order(_watched(browser)[run_id])
    assert [e["type"] for e in events].count("run.end") == 1
    assert any(e["type"] == "run.resume" for e in events)
    assert events[-1]["status"] == "completed" and events[-1]["output"] == "Refund of A-1 is done."

    # The cut-off worker takes runs again: the other one, busy 3 s a run, leaves it some once its
    # connections have caught up (seconds after the cable is back).
    site.model.script(MODEL, [Reply(delay(3), text("again"), finish("stop"), usage(3, 1))] * 6)
    again = [site.start_run(f"again {n}") for n in range(6)]
    wait_for(
        lambda: (
            site.sql(
                "SELECT count(*) FROM chamvi_runs_run WHERE id = ANY(%s) AND status = 'completed'", again
            )
            == [(6,)]
        ),
        60,
        site.logs,
    )
    assert any(r in site.log(holder.name) for r in again), site.logs()
