"""Settings of the latency benchmarks: the bundled project plus the test agents, with chamvi_runs'
own defaults (LEASE_SECONDS, HEARTBEAT_SECONDS, ...; tests/settings.py shortens them, this does not).

Environment: DATABASE_URL and REDIS_URL (set by the benches), CHAMVI_LAT_CONCURRENCY (runs one
worker process executes at once, when chamvi_runs has ``CONCURRENCY``), CHAMVI_LAT_LEASE_SECONDS and
CHAMVI_LAT_HEARTBEAT_SECONDS (to see what recovery costs at other leases; unset: the defaults)."""

import os

os.environ.setdefault("OPENAI_API_KEY", "bench")

from project.settings import *  # noqa: F403
from project.settings import CHAMVI_RUNS, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
CHAMVI_RUNS = {**CHAMVI_RUNS, "QUEUE": "chamvi"}
for _env, _key in [
    ("CHAMVI_LAT_CONCURRENCY", "CONCURRENCY"),
    ("CHAMVI_LAT_LEASE_SECONDS", "LEASE_SECONDS"),
    ("CHAMVI_LAT_HEARTBEAT_SECONDS", "HEARTBEAT_SECONDS"),
]:
    if os.environ.get(_env):
        CHAMVI_RUNS[_key] = float(os.environ[_env]) if "SECONDS" in _key else int(os.environ[_env])
MEDIA_ROOT = "/tmp/chamvi-lat-media"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
