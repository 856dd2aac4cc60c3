"""Test settings: the bundled project plus the test agents, on the real PostgreSQL and Redis."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chamvi")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("OPENAI_API_KEY", "test")

from project.settings import *  # noqa: F403
from project.settings import CHAMVI_RUNS, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
CHAMVI_RUNS = {
    **CHAMVI_RUNS,
    "LEASE_SECONDS": 4,
    "HEARTBEAT_SECONDS": 1,
    "CANCEL_POLL_SECONDS": 0.2,
    "MODEL_BACKOFF_SECONDS": 0.05,
    "QUEUE": "chamvi",
}
MEDIA_ROOT = os.environ.get("CHAMVI_TEST_MEDIA", "/tmp/chamvi-test-media")
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
