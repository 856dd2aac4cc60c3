"""The peers' virtualenvs: each system outside the project gets one of its own, made on first use.

None of these packages is a dependency of the project: they live under ``$CHAMVI_BENCH_HOME``
(default ``/tmp/chamvi-bench``), in ``venvs/<name>``, made with ``python3 -m venv`` and pip.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"

# What each venv holds. bare, rawsql and chamvi use the project's own venv: the same openai and
# psycopg that chamvi_runs runs on, so the ceilings differ from chamvi only by what chamvi does.
REQUIREMENTS: dict[str, list[str]] = {
    "langgraph": [
        "langgraph>=1",
        "langgraph-checkpoint-postgres",
        "langchain-openai",
        "psycopg[binary,pool]",
    ],
    "dbos": ["dbos>=3,<4", "openai", "psycopg[binary]"],
    "report": ["matplotlib"],
}

# The distributions whose versions the report names, per venv.
REPORTED: dict[str, list[str]] = {
    "project": ["openai", "psycopg", "django", "rq", "django-rq", "chamvi-runs"],
    "langgraph": [
        "langgraph",
        "langgraph-checkpoint-postgres",
        "langchain-openai",
        "langchain-core",
        "openai",
    ],
    "dbos": ["dbos", "openai"],
    "report": ["matplotlib"],
}


def home() -> Path:
    return Path(os.environ.get("CHAMVI_BENCH_HOME", "/tmp/chamvi-bench"))


def python_for(name: str) -> Path:
    """The interpreter of venv ``name`` (``project``: the project's own .venv), made if missing."""
    if name == "project":
        return PROJECT_PYTHON
    venv = home() / "venvs" / name
    python = venv / "bin" / "python"
    # A stamp of the requirements: changing them above re-runs pip on the next bench.
    stamp = venv / (".installed-" + hashlib.sha1(json.dumps(REQUIREMENTS[name]).encode()).hexdigest()[:10])
    if stamp.exists():
        return python
    if not python.exists():
        print(f"bench: creating venv {venv}", file=sys.stderr, flush=True)
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    print(f"bench: pip install {' '.join(REQUIREMENTS[name])} into {venv}", file=sys.stderr, flush=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-qq", "--disable-pip-version-check", *REQUIREMENTS[name]],
        check=True,
    )
    for old in venv.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return python


def versions(name: str) -> dict[str, str]:
    """Installed versions of the distributions the report names for venv ``name``."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = metadata.version(d)\n"
        "    except metadata.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    result = subprocess.run(
        [str(python_for(name)), "-c", code, *REPORTED[name]], capture_output=True, text=True, check=True
    )
    return dict(json.loads(result.stdout))
