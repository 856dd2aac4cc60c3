"""Test settings: the bundled project plus the test agents, on the real PostgreSQL and Redis."""

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chamvi")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("OPENAI_API_KEY", "test")
# The demo's "support" agent reads its model from the environment (project/settings.py): this
# process and every worker the suite starts give it the same one, so they have the same version of
# it (SPEC §14) and the workers take the runs this process starts.
os.environ.setdefault("CHAMVI_MODEL", "m-support")

from project.settings import *  # noqa: F403
from project.settings import CHAMVI_RUNS, CHANNEL_LAYERS, INSTALLED_APPS, REDIS_URL

# Without "daphne", whose app only swaps in its runserver: every worker, command and site process
# the suite starts would import its server (twisted) for nothing, 0.4 s each. Tests start daphne
# itself as a process (tests/support/processes.py).
INSTALLED_APPS = [*(app for app in INSTALLED_APPS if app != "daphne"), "tests.testapp"]
CHAMVI_RUNS = {
    **CHAMVI_RUNS,
    "LEASE_SECONDS": 4,
    "HEARTBEAT_SECONDS": 1,
    "CANCEL_POLL_SECONDS": 0.2,
    "MODEL_BACKOFF_SECONDS": 0.05,
    "QUEUE": "chamvi",
}
# make test's Responses lane (tests/lanes.py): every process of it, workers and daphne included,
# calls the model through the Responses API adapter.
if os.environ.get("CHAMVI_TEST_MODEL_API") == "responses":
    CHAMVI_RUNS["MODEL"] = "chamvi_runs.llm_responses.ResponsesModel"
MEDIA_ROOT = Path(os.environ.get("CHAMVI_TEST_MEDIA", "/tmp/chamvi-test-media"))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Redis pub/sub channels ignore the URL's database number: two suites on one server (make test's
# lanes, a helper's run beside CI) would hear each other's thread groups, which are named after the
# thread, without a prefix of their own.
_layer: dict[str, Any] = dict(CHANNEL_LAYERS["default"])
if "CONFIG" in _layer:  # channels-redis (an empty REDIS_URL: the in-memory layer, embedded mode)
    _layer["CONFIG"] = {**_layer["CONFIG"], "prefix": "chamvi-test-" + REDIS_URL.rsplit("/", 1)[-1]}
CHANNEL_LAYERS = {"default": _layer}
