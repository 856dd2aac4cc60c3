"""The bundled project's settings with the database connection settings under test
(bench/conn_leak.py): ``CHAMVI_BENCH_CONN_MAX_AGE`` seconds (empty: the project's 0) and, with
``CHAMVI_BENCH_POOL`` set, Django's psycopg pool of at most that many connections. The web process's
connections are named ``chamvi-bench-web`` in pg_stat_activity."""

import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES

DEBUG = False
DATABASES["default"]["OPTIONS"]["application_name"] = "chamvi-bench-web"
if os.environ.get("CHAMVI_BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["CHAMVI_BENCH_CONN_MAX_AGE"])
if os.environ.get("CHAMVI_BENCH_POOL"):
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": int(os.environ["CHAMVI_BENCH_POOL"]),
    }
