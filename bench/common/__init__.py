"""What more than one bench uses: the Django settings of every bench process (``settings``), the
scripted model as a process of its own (``scripted_model``) and the model that stamps its chunks
with their send time (``stamping_model``, ``stamps``), the deployment's processes and their database
and Redis db (``stack``), what a process or PostgreSQL spent (``procstat``, ``pgstats``), databases
made and dropped (``databases``), percentiles and plain tables (``stats``).

Standard library only at this level: the peers' venvs of ``bench.compare`` import it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: the benches start ``manage.py`` and ``python -m bench...`` there."""
