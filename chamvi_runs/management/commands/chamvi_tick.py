"""``manage.py chamvi_tick``: recover expired claims, re-enqueue lost jobs, expire approvals,
re-send notifications, and move on the runs of agent versions gone from every worker. Loops by
default; ``--once`` suits cron.

The loop says once what it works on (interval, queue, database), then one line per pass that did
something, none for a quiet one; ``--once`` prints what its pass did, nothing included. ``-v 0``
prints nothing, ``-v 2`` every pass. A pass that fails (the database restarting) is logged and the
loop goes on; with ``--once`` the command fails, so cron reports it."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from chamvi_runs.modes import mode
from chamvi_runs.runtime.janitor import TickReport, tick_once

logger = logging.getLogger(__name__)


def summary(report: TickReport) -> str:
    """What one pass did, in words: each count with what it counts."""
    said = (
        f"recovered {report.recovered} expired claim(s), re-queued {report.requeued} lost job(s), "
        f"expired {report.expired} approval(s), re-sent {report.notified} notification(s)"
    )
    if report.moved or report.version_failed:
        said += (
            f", moved {report.moved} run(s) of a gone agent version to the current one and failed "
            f"{report.version_failed} (their agents' on_version_change)"
        )
    return said


def _where() -> str:
    """The queue and the database the passes work on (never a password)."""
    db = connection.settings_dict
    place = f"{db.get('HOST') or 'local socket'}{':' + str(db['PORT']) if db.get('PORT') else ''}"
    return f'{mode()}, database {connection.vendor} "{db.get("NAME")}" on {place}'


class Command(BaseCommand):
    help = (
        "Run the chamvi_runs janitor (recovery, lost jobs, approval expiry, notifications, "
        "runs of gone agent versions)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="Run one pass and exit (for cron).")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between passes (default 5).")

    def handle(self, *args: Any, once: bool, interval: float, verbosity: int, **options: Any) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise CommandError(f"--interval must be a number of seconds above 0, not {interval:g}")
        if not once and verbosity > 0:
            self.stdout.write(f"chamvi_tick: a pass every {interval:g} s on {_where()}. Ctrl-C stops it.")
        while True:
            close_old_connections()
            try:
                report = tick_once()
            except Exception as exc:
                if once:
                    raise
                # The database restarting or Redis away must not end the janitor: nothing would
                # recover runs until someone started it again. The next pass tries again.
                logger.exception("chamvi_tick: a pass failed")
                self.stderr.write(
                    f"chamvi_tick: the pass failed ({type(exc).__name__}: {exc}); next in {interval:g} s"
                )
                connection.close()
            else:
                if verbosity > 1 or (verbosity > 0 and (once or not report.quiet)):
                    self.stdout.write(summary(report))
            if once:
                return
            time.sleep(interval)
