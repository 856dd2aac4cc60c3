"""``manage.py chamvi_tick``: recover expired claims, re-enqueue lost jobs, expire approvals and
re-send notifications. Loops by default; ``--once`` suits cron."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from chamvi_runs.runtime.janitor import tick_once


class Command(BaseCommand):
    help = "Run the chamvi_runs janitor (recovery, lost jobs, approval expiry, notifications)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="Run one pass and exit (for cron).")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between passes (default 5).")

    def handle(self, *args: Any, once: bool, interval: float, **options: Any) -> None:
        while True:
            close_old_connections()
            report = tick_once()
            if options["verbosity"] > 1 or once:
                self.stdout.write(
                    f"enqueued {report.enqueued}, expired {report.expired}, notified {report.notified}"
                )
            if once:
                return
            time.sleep(interval)
