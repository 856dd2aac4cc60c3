"""Engine overhead against the bare openai client, measured in the same run, in one process.

    make bench-overhead   # or: .venv/bin/python -m bench.overhead [--runs 200]

(``make bench`` is the comparison with the peers, bench/compare/: docs/benchmarks.md.)

Both sides stream the same scripted replies from tests/support/scripted_server.py over real HTTP through
the real openai client. The baseline makes the model calls alone; chamvi_runs executes whole runs
(claim, lease keeper, steps + checkpoint per model call, tool execution, events in Redis and the
channel layer, settle) on PostgreSQL. Needs PostgreSQL and Redis (DATABASE_URL / REDIS_URL; the
database "chamvi_bench" is created if missing).
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=100, help="runs per scenario (default 100)")
    args = parser.parse_args()

    databases.create_missing(*databases.split(os.environ["DATABASE_URL"]))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from openai import OpenAI

    from chamvi_runs import start_run
    from chamvi_runs.models import Run
    from chamvi_runs.runtime import engine
    from tests.support.scripted_server import Reply, ScriptedServer, finish, text, tool_call, usage

    scenarios = {
        "tool call + answer (2 model calls, 1 tool)": lambda: [
            Reply(
                text("Adding."), tool_call("c1", "add", '{"a": 1, "b": 2}'), finish("tool_calls"), usage(9, 9)
            ),
            Reply(text("It is 3."), finish("stop"), usage(9, 3)),
        ],
        "long answer (1 model call, 200 deltas)": lambda: [
            Reply(*[text(f"w{n} ") for n in range(200)], finish("stop"), usage(9, 200)),
        ],
    }

    with ScriptedServer() as server:
        settings.CHAMVI_RUNS = {
            **settings.CHAMVI_RUNS,
            "MODEL": "chamvi_runs.llm_openai.OpenAIModel",
            "OPENAI": {"api_key": "bench", "base_url": server.base_url, "max_retries": 0},
        }
        client = OpenAI(api_key="bench", base_url=server.base_url, max_retries=0)
        print(f"{args.runs} runs per scenario; times are per run (median, p95)\n")
        for title, replies in scenarios.items():
            model = "m-basic"

            def baseline(replies=replies, model=model) -> None:
                script = replies()
                server.script(model, script)
                for _ in script:
                    stream = client.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": "x"}],
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    for _chunk in stream:
                        pass

            def chamvi(replies=replies, model=model) -> None:
                server.script(model, replies())
                run = start_run("basic", "x")
                engine.execute(run.pk)
                status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
                assert status == "completed", status

            results = {}
            for name, fn in (("openai client alone", baseline), ("chamvi_runs run", chamvi)):
                fn()  # warm up connections and caches
                times = []
                for _ in range(args.runs):
                    started = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - started)
                times.sort()
                results[name] = (statistics.median(times), times[int(len(times) * 0.95) - 1])
            base, ours = results["openai client alone"], results["chamvi_runs run"]
            print(title)
            for name, (median, p95) in results.items():
                print(f"  {name:<22} {median * 1000:8.2f} ms  p95 {p95 * 1000:8.2f} ms")
            overhead = 1000 * (ours[0] - base[0])
            print(f"  ratio (chamvi / baseline) {ours[0] / base[0]:.2f}x; overhead {overhead:.2f} ms\n")
        server.clear()
    Run.objects.all().delete()


if __name__ == "__main__":
    main()
