"""Settings of chamvi_runs in the bench: the bundled project's (production defaults for leases and
heartbeats), plus the bench's agent, with DEBUG off (DEBUG records every SQL statement in memory).

The bench sets DATABASE_URL, REDIS_URL, OPENAI_BASE_URL and OPENAI_API_KEY for both processes that
use it, the producer and the ``rqworker``.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import CHAMVI_RUNS, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.bench_agents"]
DEBUG = False
if os.environ.get("CHAMVI_BENCH_CONCURRENCY"):  # bench/compare.py --chamvi-concurrency
    CHAMVI_RUNS = {**CHAMVI_RUNS, "CONCURRENCY": int(os.environ["CHAMVI_BENCH_CONCURRENCY"])}
