"""The browser client's own tests, run by ``make test``: its unit tests under Node's built-in runner
(``tests/js/*.test.mjs``, fed recorded event sequences; no npm package), and a type check of a site's
TypeScript against ``client.d.ts`` (``tests/js/types/site.ts``) with the TypeScript compiler, which
npm installs once into ``.venv``. Without Node (or npm) they are skipped, and with ``CI=true`` they
fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPESCRIPT = "typescript@5.9.3"
TSC_HOME = ROOT / ".venv" / "typescript"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if _in_ci():
            pytest.fail(f"{name} is not installed: the client's tests must run in CI", pytrace=False)
        pytest.skip(f"{name} is not installed")
    return path


def _run(*command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(120)
def test_the_client_passes_its_node_unit_tests() -> None:
    node = _tool("node")
    done = _run(
        node,
        "--test",
        "--test-reporter=dot",
        *sorted(map(str, (ROOT / "tests" / "js").glob("*.test.mjs"))),
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@pytest.mark.timeout(300)
def test_a_sites_typescript_type_checks_against_the_declarations() -> None:
    tsc = TSC_HOME / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        npm = _tool("npm")
        installed = _run(
            npm, "install", "--prefix", str(TSC_HOME), "--no-audit", "--no-fund", TYPESCRIPT, timeout=240
        )
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    checked = _run(str(tsc), "-p", "tests/js/types", timeout=120)
    assert checked.returncode == 0, checked.stdout[-6000:] + checked.stderr[-3000:]
