"""chamvi_runs through its real path: this process is the producer (``start_run``), RQ on Redis
carries the doorbell, and one ``manage.py rqworker chamvi`` process (the worker class of the
settings, ``chamvi_runs.worker.Worker``) executes the runs with the bench's agent
(bench/compare/agents.py, discovered like any app's agents.py).

A batch is enqueued at once, as a backlog is for a worker (which takes as many runs at once as its
``CHAMVI_RUNS["CONCURRENCY"]`` allows), and is done when every run of it has settled. The producer
watches that with one count of settled runs every 100 ms; those reads are transactions of the
measured database, so it reports them (``own_commits``) and the orchestrator takes them off. RQ's
finished jobs cannot tell: a job only hands its run to one of the worker's threads. The worker's CPU
is its own; the producer's is reported beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.compare.systems.driver import config, serve

SETTLED = ("completed", "failed", "cancelled")


def environment(cfg: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.common.settings",
        DATABASE_URL=cfg["dsn"],
        REDIS_URL=cfg["redis_url"],
        OPENAI_BASE_URL=cfg["base_url"],
        OPENAI_API_KEY="bench",
        PYTHONUNBUFFERED="1",
    )
    return env


class Chamvi:
    def __init__(self, cfg: dict[str, Any]) -> None:
        env = environment(cfg)
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.agent = f"bench_{cfg['pacing']}"
        self.log_path = Path(cfg["log_dir"]) / f"chamvi-worker-{cfg['label']}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.log_path.open("w")
        self.worker = subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", "chamvi"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.worker_pid = self.worker.pid
        self._wait(lambda: "Listening on" in self.log_path.read_text(errors="replace"), 60, "the worker")
        self.run_ids: list[str] = []
        self.own_commits = 0

    def _wait(self, predicate: Any, timeout: float, what: str, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.worker.returncode}):\n{self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}:\n{self._tail()}")
            time.sleep(poll)

    def _tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def _settled(self) -> bool:
        from chamvi_runs.models import Run

        self.own_commits += 1  # one autocommit SELECT
        settled = Run.objects.filter(pk__in=self.run_ids, status__in=SETTLED).count()
        return settled == len(self.run_ids)

    def run_batch(self, runs: int) -> dict[str, Any]:
        from bench.compare import workload
        from chamvi_runs import start_run

        self.own_commits = 0
        message = {"message": workload.USER_MESSAGE}
        self.run_ids = [str(start_run(self.agent, message).pk) for _ in range(runs)]
        self._wait(self._settled, 60 + 10 * runs, f"{runs} runs to settle", poll=0.1)
        return {"own_commits": self.own_commits + 1}  # + verify's read

    def verify(self) -> None:
        from bench.compare import workload
        from chamvi_runs.models import Run

        done = Run.objects.filter(pk__in=self.run_ids, status="completed", output=workload.FINAL_TEXT).count()
        if done != len(self.run_ids):
            raise AssertionError(f"{len(self.run_ids) - done} of {len(self.run_ids)} runs did not complete")

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(15)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(5)
        self.log.close()


if __name__ == "__main__":
    cfg = config()
    serve(Chamvi(cfg), cfg)
