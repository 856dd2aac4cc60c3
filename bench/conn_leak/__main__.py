"""PostgreSQL connections a daphne web process holds after N page loads, per connection setting.

A real ``daphne project.asgi:application`` (the bundled project, DEBUG off, the ``rq`` executor so
that no executor thread holds a connection of its own) serves a logged-in superuser N page loads
(the admin index, the run changelist, the approvals page, the user changelist, in turn, one at a time);
pg_stat_activity is read for the backends named ``chamvi-bench-web`` after each load (the most
seen) and after the last one (held). Each setting gets a daphne of its own:

- ``persistent``: ``CONN_MAX_AGE = 500`` (dj_database_url's default in many sites);
- ``per-request``: ``CONN_MAX_AGE = 0`` (what chamvi_runs asks of web processes);
- ``pool``: ``CONN_MAX_AGE = 0`` with Django's psycopg pool (``OPTIONS={"pool": ...}``, max 4).

    .venv/bin/python -m bench.conn_leak                 # 240 loads, every setting
    .venv/bin/python -m bench.conn_leak --loads 60 --settings persistent,pool --json

Uses the server of DATABASE_URL (database ``chamvi_bench_connleak``, recreated) and REDIS_URL.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from bench.conn_leak.pages import SETTINGS, Server, measure, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=240)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"some of {','.join(SETTINGS)}")
    parser.add_argument("--database", default="chamvi_bench_connleak")
    parser.add_argument("--json", action="store_true", help="one JSON line per setting")
    args = parser.parse_args()
    server = Server()
    prepare(server, args.database)
    try:
        results = [measure(server, args.database, s, args.loads) for s in args.settings.split(",")]
    finally:
        server.admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    if args.json:
        for result in results:
            print(json.dumps(asdict(result)))
        return
    print(f"PostgreSQL {server.version()}; backends of one daphne after {args.loads} page loads, logged in")
    print("| setting | held after the loads | of which idle | most seen |")
    print("| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r.setting} | {r.held} | {r.idle} | {r.peak} |")


if __name__ == "__main__":
    main()
