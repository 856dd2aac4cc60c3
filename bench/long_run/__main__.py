"""The cost of a step as a run grows: runs of 20, 100 and 200 tool turns, against the bare openai
client making the same model calls with the same histories, measured in the same run.

    make bench-long   # or: .venv/bin/python -m bench.long_run [--turns 20 100 200]

A turn is a model call that calls a tool, and the tool's result: about 1 KB of JSON, as the peers'
workload's tools return (a history of 200 turns is some 250 KB). The Chat Completions API takes the
whole history with every call, so the client's own cost grows with it on both sides; what this
bench isolates is ours: the CPU of the execution beyond the client's (per turn, and for the first
and last ten turns of the run), and the bytes PostgreSQL writes (WAL) per turn. A step that wrote
the whole history again would show both growing with the length of the run. Needs PostgreSQL and
Redis (DATABASE_URL / REDIS_URL; the database "chamvi_bench" is created if missing).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

from bench.common import databases

MODEL = "m-long-run"
WARM_UP = 5
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chamvi_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")


def _ms(seconds: list[float]) -> float:
    return sum(seconds) / len(seconds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, nargs="+", default=[20, 100, 200], help="tool turns per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per length; the medians are printed")
    args = parser.parse_args()

    databases.create_missing(*databases.split(os.environ["DATABASE_URL"]))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from openai import OpenAI

    from chamvi_runs import Agent, Budget, signals, start_run, tool
    from chamvi_runs.models import Checkpoint, Run
    from chamvi_runs.runtime import engine
    from tests.support.scripted_server import Reply, ScriptedServer, finish, text, tool_call, usage

    @tool
    def lookup_order(order_id: str) -> dict:
        """An order and its history: about 1 KB of JSON, none of it like the others'."""
        digest = hashlib.sha256(order_id.encode()).hexdigest()
        return {"order_id": order_id, "events": [digest * 3 for _ in range(4)], "status": "delivered"}

    agent = Agent(
        name="long_run",
        model=MODEL,
        instructions="Look the orders up.",
        tools=[lookup_order],
        budget=Budget(max_steps=max(*args.turns, WARM_UP) + 1),
    )

    def script(turns: int) -> list[Reply]:
        calls = [
            Reply(
                tool_call(f"c{n}", "lookup_order", f'{{"order_id": "A-{n}"}}'),
                finish("tool_calls"),
                usage(9, 9),
            )
            for n in range(turns)
        ]
        return [*calls, Reply(text("Done."), finish("stop"), usage(9, 2))]

    def wal() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            return int(cursor.fetchone()[0])

    saves: list[float] = []

    def on_saved(**_: object) -> None:
        saves.append(time.process_time())

    signals.step_saved.connect(on_saved, weak=False)

    with ScriptedServer() as server:
        settings.CHAMVI_RUNS = {
            **settings.CHAMVI_RUNS,
            "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
            "OPENAI": {"api_key": "bench", "base_url": server.base_url, "max_retries": 0},
        }
        client = OpenAI(api_key="bench", base_url=server.base_url, max_retries=0)
        tools = [t.schema() for t in agent.tools]

        def chamvi(turns: int) -> tuple[str, int, list[float]]:
            """The run, the WAL it wrote, and the CPU from one save to the next (a model call and
            its tool: one turn)."""
            server.script(MODEL, script(turns))
            run = start_run("long_run", "x")
            saves.clear()
            before_wal = wal()
            started = time.process_time()
            engine.execute(run.pk)
            written = wal() - before_wal
            status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
            assert status == "completed", status
            return run.pk, written, [b - a for a, b in zip([started, *saves], saves, strict=False)]

        def baseline(run_id: str) -> list[float]:
            """CPU of the same model calls through the bare client, each with the history the run
            sent it (rebuilt from the run's final history: it grows by a call and a result a turn)."""
            history = Checkpoint.objects.get(run_id=run_id).messages
            calls = [n for n, m in enumerate(history) if m.get("role") == "assistant"]
            server.script(MODEL, script(len(calls) - 1))
            system = [{"role": "system", "content": agent.instructions}]
            times = []
            for end in calls:
                started = time.process_time()
                stream = client.chat.completions.create(
                    model=MODEL,
                    messages=[*system, *history[:end]],
                    tools=tools,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                for _chunk in stream:
                    pass
                times.append(time.process_time() - started)
            return times

        baseline(chamvi(WARM_UP)[0])  # warm up connections and caches
        print("per tool turn: CPU in ms (the run's, the bare client's, ours: the difference), and")
        print("ours over the run's first and last ten turns; KB of WAL written per turn\n")
        print(
            f"{'turns':>6} {'run':>8} {'client':>8} {'ours':>8} {'first 10':>9} {'last 10':>9} {'WAL KB':>8}"
        )
        for turns in args.turns:
            rows = []
            for _ in range(args.reps):
                run_id, written, steps = chamvi(turns)
                base = baseline(run_id)
                ours = [s - b for s, b in zip(steps, base, strict=True)]
                rows.append(
                    (
                        _ms(steps),
                        _ms(base),
                        _ms(ours),
                        _ms(ours[:10]),
                        _ms(ours[-10:]),
                        written / turns / 1024,
                    )
                )
            run_ms, client_ms, ours_ms, first, last, wal_kb = (
                statistics.median(col) for col in zip(*rows, strict=True)
            )
            print(
                f"{turns:>6} {run_ms:>8.2f} {client_ms:>8.2f} {ours_ms:>8.2f} {first:>9.2f} "
                f"{last:>9.2f} {wal_kb:>8.1f}"
            )
        print("\nFlat 'ours' from 20 to 200 turns, and from the first to the last ten: a step's own")
        print("cost does not grow with the history. WAL is the whole cluster's: run it on a quiet server.")
    Run.objects.all().delete()


if __name__ == "__main__":
    main()
