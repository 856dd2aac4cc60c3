"""The layout's promises, checked on the source: a pure core, one openai module, one status writer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parent.parent / "chamvi_runs"
FRAMEWORKS = {"django", "rq", "django_rq", "channels", "channels_redis", "openai", "redis", "asgiref"}


def _modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_core_imports_no_framework():
    for path in (PACKAGE / "core").glob("*.py"):
        assert not (_imports(path) & FRAMEWORKS), f"{path.name} imports {_imports(path) & FRAMEWORKS}"


def test_only_llm_openai_imports_openai():
    importers = sorted(p.name for p in _modules() if "openai" in _imports(p))
    assert importers == ["llm_openai.py"]


def test_only_the_store_writes_a_run_status():
    writers = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update", "create", "save", "bulk_update", "update_or_create")
                and any(k.arg in ("status", "claim_owner", "attempt") for k in node.keywords)
            ):
                writers.add(path.name)
    assert writers == {"store.py"}
