"""What a run's saves cost the execution's thread, written as SQL (chamvi_runs.store.step_sql, what
PostgreSQL sites run) against the ORM's statements (the baseline, what other databases run), in
the same process and the same run of the bench.

    .venv/bin/python -m bench.step_writes [--runs 200] [--turns 3]

Each run is executed in this process through engine.execute against the scripted model server:
``--turns`` model calls that each call a tool, then an answer. Rounds of 20 runs alternate the two
ways, so both see the same machine. It prints the CPU time of the executing thread per run (the
saves, and all the rest an execution does, identical on both sides), the median over the rounds,
and the ratio. Needs PostgreSQL and Redis (DATABASE_URL / REDIS_URL; the database
"chamvi_bench" is created if missing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.common import databases

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chamvi_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")

ROUND = 20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="runs each way (default 200)")
    parser.add_argument("--turns", type=int, default=3, help="tool-calling model calls a run (default 3)")
    args = parser.parse_args()

    databases.create_missing(*databases.split(os.environ["DATABASE_URL"]))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from chamvi_runs import start_run
    from chamvi_runs.models import Run
    from chamvi_runs.runtime import engine
    from chamvi_runs.store import step_sql
    from tests.support.scripted_server import Reply, ScriptedServer, finish, text, tool_call, usage

    sql = step_sql.applies

    def replies() -> list[Reply]:
        calls = [
            Reply(
                text("Adding."),
                tool_call(f"c{n}", "add", '{"a": 1, "b": 2}'),
                finish("tool_calls"),
                usage(9, 9),
            )
            for n in range(args.turns)
        ]
        return [*calls, Reply(text("It is 3."), finish("stop"), usage(9, 3))]

    with ScriptedServer() as server:
        settings.CHAMVI_RUNS = {
            **settings.CHAMVI_RUNS,
            "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
            "OPENAI": {"api_key": "bench", "base_url": server.base_url, "max_retries": 0},
        }

        def one() -> None:
            server.script("m-basic", replies())
            run = start_run("basic", "x")
            engine.execute(run.pk)

        ways = {"ORM (baseline)": lambda: False, "SQL": sql}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        for applies in ways.values():  # warm up both
            step_sql.applies = applies
            one()
        for _ in range(max(1, args.runs // ROUND)):
            for name, applies in ways.items():
                step_sql.applies = applies
                started = time.thread_time()
                for _ in range(ROUND):
                    one()
                cpu[name].append((time.thread_time() - started) * 1000 / ROUND)
        step_sql.applies = sql
        server.clear()
    Run.objects.all().delete()

    print(
        f"{args.runs} runs each way, {args.turns} tool calls and an answer a run; the executing thread's CPU"
    )
    medians = {name: statistics.median(values) for name, values in cpu.items()}
    for name, median in medians.items():
        spread = f"{min(cpu[name]):.2f}-{max(cpu[name]):.2f}"
        print(f"  {name:<15} {median:7.2f} ms a run (rounds {spread})")
    base, ours = medians["ORM (baseline)"], medians["SQL"]
    print(f"  ratio (SQL / ORM) {ours / base:.2f}; {base - ours:.2f} ms less a run")


if __name__ == "__main__":
    main()
