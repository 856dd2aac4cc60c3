"""The comparative bench (bench/compare/, ``make bench``) starts and writes its table: the bare
calls and chamvi_runs through a real rqworker, one repetition of two runs. The peers' venvs and the
chart are left out (they install packages); databases chamvi_bench_smoke_*, Redis db 11, and its
output in a temporary folder, so it collides neither with the real bench nor with docs/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(90)
def test_the_bench_writes_a_table_for_chamvi_and_the_bare_calls(tmp_path: Path) -> None:
    require("DATABASE_URL")
    require("REDIS_URL")
    env = dict(os.environ, CHAMVI_BENCH_HOME=str(tmp_path / "home"))
    command = [sys.executable, "-m", "bench.compare", "--smoke", "--runs", "2", "--out-dir", str(tmp_path)]
    command += ["--db-prefix", "chamvi_bench_smoke_", "--redis-db", "11"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=80)
    assert result.returncode == 0, result.stdout + result.stderr

    doc = (tmp_path / "benchmarks.md").read_text()
    rows: dict[str, str] = {}
    for line in doc.splitlines():  # the first table: the figures (the ratio tables follow it)
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0].lstrip("| "), line)
    bare, chamvi = rows["bare openai calls (ceiling 1)"], rows["chamvi_runs (start_run → RQ → rqworker)"]
    runs_per_s, worker_cpu, _pg, commits, stored, _disk = (cell.strip() for cell in chamvi.split("|")[2:8])
    assert float(runs_per_s) > 0 and float(worker_cpu) > 0
    assert float(commits) > 6 and float(stored.replace(",", "")) > 1000  # steps and checkpoints were written
    assert bare.split("|")[5].strip() == "\u2013"  # the bare calls commit nothing
    assert "runs/s ÷ bare" in doc and "chamvi_runs (start_run → RQ → rqworker)" in result.stdout
    assert not (tmp_path / "benchmarks.png").exists()
