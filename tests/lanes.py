"""``make test``: the whole suite in two lanes at once, then the tests that must run alone.

The system tier mostly waits (for leases to expire, workers to start, paced streams, Chromium) and
the unit and integration tiers mostly compute, so on a small machine they overlap well: one after
the other they took 12 to 14 minutes on a two-core machine, side by side 9. Each lane has a
database and a Redis database of its own (the system lane's names are derived from DATABASE_URL
and REDIS_URL, or given as SYSTEM_DATABASE_URL and SYSTEM_REDIS_URL), so the lanes share no rows,
queues, channel groups or replay buffers. The tests marked ``alone`` restart PostgreSQL or Redis,
which would cut the other lane's connections: they run after both lanes, by themselves.

The tests of the engine that call the model run twice: in their lane on Chat Completions, and again
on the Responses API adapter (``CHAMVI_TEST_MODEL_API=responses``, tests/conftest.py; the scripted
server answers both with the same replies) in a third lane, on a database and a Redis database of
its own, started as soon as either of the first two ends, beside the other: alone it takes a
minute on a two-core machine (20 s of CPU, a fresh database included), so it adds at most that.

``pytest`` alone still runs everything in one process, one test after another.

    python -m tests.lanes [pytest options for every lane]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chamvi"  # tests/settings.py's defaults
REDIS_URL = "redis://127.0.0.1:6379/15"
REDIS_DATABASES = 16  # a Redis server's default `databases`
DURATIONS = "--durations=15"  # each lane names its slowest tests: where the next minute is
RESPONSES_TESTS = [
    *(
        f"tests/integration/{name}.py"
        for name in (
            "test_engine_basics",
            "test_engine_failures",
            "test_approvals_and_effects",
            "test_approval_binding",
            "test_questions",
            "test_regenerate",
            "test_edit_approval",
            "test_call_counting",
            "test_history_parts",
            "test_claims_and_steering",
            "test_child_runs",
            "test_stream_repair",
            "test_settled_histories",
            "test_unstorable_text",
            "test_cancel_races",
            "test_effect_leases",
            "test_conversation_http",
            "test_thread_scope",
            "test_thread_ownership",
            "test_input_caps",
            "test_versions",
            "test_tracing",
            "test_docs_delegation",
        )
    ),
    # Holds what a Chat Completions turn stores: a Responses turn with reasoning also keeps its items
    # (tests/integration/test_responses_reasoning.py holds those).
    "--deselect",
    "tests/integration/test_engine_basics.py::test_text_answer_completes_with_steps_checkpoint_and_usage",
    # A worker SIGKILLed mid-stream, and mid-save: the recovering worker sends the history back.
    "tests/system/test_worker_process.py::test_sigkill_mid_stream_is_recovered_by_the_janitor",
    "tests/system/faults/test_history_crash.py",
]


def database_of_its_own(url: str) -> str:
    """The same server, another database: pytest-django creates and drops ``test_<name>``."""
    return database_named(url, "system")


def database_named(url: str, suffix: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/') or '/chamvi'}_{suffix}"))


def redis_database_of_its_own(url: str, before: int = 1) -> str:
    parts = urlsplit(url)
    number = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(number - before) % REDIS_DATABASES}"))


@dataclass
class Lane:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    took: float = 0.0

    def start(self, extra: list[str], *, to_log: bool) -> None:
        out = None
        if to_log:
            self.log = Path(tempfile.mkstemp(prefix=f"chamvi-lane-{self.name}-", suffix=".log")[1])
            out = self.log.open("wb")
        print(f"--- {self.name}: pytest {' '.join(self.args + extra)}", flush=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *self.args, *extra],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
        )
        if out:
            out.close()

    def ended(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is not None

    def wait(self) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        self.took = time.monotonic() - self.started
        return code

    def report(self, code: int) -> None:
        if self.log:
            print(f"\n--- {self.name}: its output", flush=True)
            sys.stdout.write(self.log.read_text(errors="replace"))
            self.log.unlink()
        verdict = "passed" if code == 0 else f"FAILED (pytest exit code {code})"
        print(f"--- {self.name}: {verdict} in {self.took:.0f} s", flush=True)


def main(extra: list[str]) -> int:
    database = os.environ.get("DATABASE_URL", DATABASE_URL)
    redis = os.environ.get("REDIS_URL", REDIS_URL)
    system_env = {
        "DATABASE_URL": os.environ.get("SYSTEM_DATABASE_URL") or database_of_its_own(database),
        "REDIS_URL": os.environ.get("SYSTEM_REDIS_URL") or redis_database_of_its_own(redis),
    }
    responses_env = {
        "DATABASE_URL": database_named(database, "responses"),
        "REDIS_URL": redis_database_of_its_own(redis, before=2),
        "CHAMVI_TEST_MODEL_API": "responses",
    }
    computing = Lane("unit and integration", ["tests/unit", "tests/integration", DURATIONS])
    waiting = Lane("system", ["tests/system", "-m", "not alone", DURATIONS], system_env)
    responses = Lane("the engine on the Responses API", [*RESPONSES_TESTS, DURATIONS], responses_env)
    alone = Lane("restarting PostgreSQL and Redis", ["tests/system", "-m", "alone"])

    started = time.monotonic()
    waiting.start(extra, to_log=True)  # first: its longest tests start processes and then wait
    computing.start(extra, to_log=False)
    codes: dict[str, int] = {}
    while len(codes) < 2:
        for lane in (computing, waiting):
            if lane.name not in codes and lane.ended():
                codes[lane.name] = lane.wait()
        if codes and responses.proc is None:
            responses.start(extra, to_log=True)
        time.sleep(0.5)
    codes[responses.name] = responses.wait()
    for lane in (computing, waiting, responses):
        lane.report(codes[lane.name])
    alone.start(extra, to_log=False)
    codes[alone.name] = alone.wait()
    alone.report(codes[alone.name])

    failed = [name for name, code in codes.items() if code != 0]
    took = time.monotonic() - started
    print(f"\n=== {'FAILED: ' + ', '.join(failed) if failed else 'all lanes passed'} in {took / 60:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
