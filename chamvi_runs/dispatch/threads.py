"""Where ``worker.py``, ``dispatch/sites.py`` and ``tests/test_two_sites.py`` still import the
executor threads and the jobs from: both moved to ``chamvi_runs.modes`` (``threads.py``,
``jobs.py``), below dispatch and streaming, which both ask the mode. Remove this module once those
import from there."""

from ..modes.jobs import EXECUTE as EXECUTION
from ..modes.jobs import EXECUTE_RUN
from ..modes.threads import ThreadExecutor

JOB = EXECUTE_RUN.path

__all__ = ["EXECUTION", "JOB", "ThreadExecutor"]
