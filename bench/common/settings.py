"""The Django settings of every bench process (drivers, workers, daphne, the janitor): the bundled
project's, with its production leases and heartbeats (tests/settings.py shortens them, this does
not), plus the agents the benches run: the test suite's (``tests.testapp``: "basic" talks to model
"m-basic") and the peer comparison's (``bench.compare``: "bench_instant", "bench_paced").

DEBUG is off unless ``DJANGO_DEBUG`` says otherwise: DEBUG records every SQL statement in memory,
which costs CPU and grows a worker's RSS with its runs. A bench sets the rest in the environment:
DATABASE_URL (``?pool=N`` for Django's pool, ``?application_name=`` to find its connections in
pg_stat_activity), REDIS_URL, OPENAI_BASE_URL, CHAMVI_CONCURRENCY (the project's), and

- ``CHAMVI_BENCH_LEASE_SECONDS``, ``CHAMVI_BENCH_HEARTBEAT_SECONDS``: to see what recovery costs at
  other leases (unset: chamvi_runs' defaults);
- ``CHAMVI_BENCH_CONN_MAX_AGE``: the web process's CONN_MAX_AGE (unset: the project's 0).
"""

import os

# A key, so that the project keeps the OpenAI client rather than its offline demo model.
os.environ.setdefault("OPENAI_API_KEY", "bench")

from project.settings import *  # noqa: F403
from project.settings import CHAMVI_RUNS, DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "bench.compare"]
DEBUG = os.environ.get("DJANGO_DEBUG", "0").strip().lower() in ("1", "true", "yes", "on")
CHAMVI_RUNS = {**CHAMVI_RUNS}
for _env, _key in [
    ("CHAMVI_BENCH_LEASE_SECONDS", "LEASE_SECONDS"),
    ("CHAMVI_BENCH_HEARTBEAT_SECONDS", "HEARTBEAT_SECONDS"),
]:
    if os.environ.get(_env):
        CHAMVI_RUNS[_key] = float(os.environ[_env])
if os.environ.get("CHAMVI_BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["CHAMVI_BENCH_CONN_MAX_AGE"])
MEDIA_ROOT = "/tmp/chamvi-bench-media"  # nothing a bench stores lands in the checkout
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # users are made per bench
