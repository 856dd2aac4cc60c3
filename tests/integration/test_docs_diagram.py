"""docs/architecture.md stays true to the code: its picture is the one its script draws, and every
file and dotted name of chamvi_runs it names exists."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
DIAGRAMS = ROOT / "docs" / "diagrams"


def test_committed_svg_is_what_the_script_draws() -> None:
    spec = importlib.util.spec_from_file_location("docs_layers", DIAGRAMS / "layers.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (DIAGRAMS / "layers.svg").read_text() == script.render(), (
        "docs/diagrams/layers.svg is stale: run python docs/diagrams/layers.py"
    )
    assert "![layers](diagrams/layers.svg)" in DOC.read_text()


def _file_exists(name: str) -> bool:
    """A path from the page, the checkout's root or the package's; a bare file name may also be
    anywhere in the package (the layer table names ``engine.py`` on the row of ``runtime/``)."""
    bases = [DOC.parent, ROOT, ROOT / "chamvi_runs"]
    return any((base / name).exists() for base in bases) or (
        "/" not in name and any((ROOT / "chamvi_runs").rglob(name))
    )


def test_every_path_named_exists() -> None:
    text = DOC.read_text()
    paths = set(re.findall(r"(?:\.\./)*[\w/-]*\w\.(?:py|js|html|svg|toml)\b|chamvi_runs/[\w/]+/", text))
    assert any(p.startswith("chamvi_runs/") for p in paths)
    assert sorted(p for p in paths if not _file_exists(p)) == []


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _defines(path: Path, names: list[str]) -> bool:
    """Whether the module at ``path`` defines (or imports) ``names[0]``, and a class of it ``names[1:]``.
    A name imported from another module of chamvi_runs is looked up there."""
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for n, name in enumerate(names):
        found: ast.stmt | None = None
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                found = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = node
            elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                if node.level == 0:
                    return True  # another project's name
                here = path.parent.relative_to(ROOT).parts
                source = [*here[: len(here) - node.level + 1], *(node.module or "").split(".")]
                return _exists(".".join([*filter(None, source), name, *names[n + 1 :]]))
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _exists(dotted: str) -> bool:
    """``chamvi_runs.a.b`` names a module, or a name defined in one (``chamvi_runs.jobs.execute_run``,
    ``chamvi_runs.runtime.engine.Execution.run``)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        path = _module_file(parts[:split])
        if path is not None:
            return split == len(parts) or _defines(path, parts[split:])
    return False


def test_every_dotted_name_exists() -> None:
    names = set(re.findall(r"\bchamvi_runs(?:\.\w+)+", DOC.read_text()))
    assert len(names) > 10
    assert sorted(n for n in names if not _exists(n)) == []
