"""Settings of the concurrency bench: the bundled project with its production leases and heartbeats,
plus the test agents ("basic" talks to model "m-basic"), with DEBUG off (DEBUG records every SQL
statement in memory, which would grow the workers' RSS with the runs).

Everything else comes from the environment the bench sets: DATABASE_URL (with ``?pool=`` for the
workers), REDIS_URL, OPENAI_BASE_URL, OPENAI_API_KEY and CHAMVI_CONCURRENCY."""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
DEBUG = False
