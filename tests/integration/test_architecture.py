"""The layout's promises, checked on the source: a pure core, one openai module, one writer of run
state."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "chamvi_runs"

# Run state: every write of these goes through chamvi_runs/store/, which fences it on status and
# claim. Artifact (attachment bytes, written before a run exists) and ApiToken (credentials, written
# by auth.py) are not run state; neither are the site's own models (users, the demo's rows).
RUN_STATE = {"Run", "StuckRun", "Step", "Checkpoint", "WaitPoint", "RunInput", "EffectRecord", "Thread"}
NOT_RUN_STATE = {"Artifact", "ApiToken", "get_user_model", "dict", "set", "list"}
CONTAINERS = (ast.Dict, ast.DictComp, ast.List, ast.ListComp, ast.Set, ast.SetComp, ast.Constant)
# Attributes that lead from a run (or a wait point) to run state: Run's reverse relations and FKs.
RUN_STATE_ATTRIBUTES = {"run", "steps", "waitpoints", "inputs", "effects", "checkpoint"}
WRITES = {
    "save",
    "delete",
    "update",
    "bulk_update",
    "bulk_create",
    "update_or_create",
    "get_or_create",
    "create",
}
# Names generic enough (``client.chat.completions.create``, ``dict.update``, ``storage.delete(name)``)
# that only a receiver known to be run state makes them a write; a model instance's save() and
# delete() and a queryset's update() take no positional argument, so on an unknown receiver those
# are flagged too.
FLAGGED_ON_UNKNOWN = WRITES - {"create"}
TABLES = re.compile(
    r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+\"?chamvi_runs_(run|step|checkpoint|waitpoint|runinput|"
    r"effectrecord|thread)\b",
    re.IGNORECASE,
)


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


def test_only_llm_openai_imports_openai():
    """Of every module, now and to come (the layers themselves are import-linter contracts in
    pyproject.toml, run by ``make test``)."""
    importers = sorted(p.name for p in _modules() if "openai" in _imports(p))
    assert importers == ["llm_openai.py"]


def test_only_tracing_imports_opentelemetry_and_the_app_imports_it_only_when_installed():
    """The ``otel`` extra is optional: the core never imports it (SPEC §15)."""
    importers = sorted(p.name for p in _modules() if "opentelemetry" in _imports(p))
    assert importers == ["tracing.py"]
    apps = (PACKAGE / "apps.py").read_text()
    assert '_installed("opentelemetry.trace")' in apps and "from . import tracing" in apps


def test_only_the_mcp_connection_imports_mcp_and_only_the_mcp_package_jsonschema():
    """The ``mcp`` extra is optional: nothing outside ``chamvi_runs.mcp`` imports it (SPEC §15), and
    importing that package does not import ``mcp`` (a second or more): its modules do on first use."""
    assert sorted(str(p.relative_to(PACKAGE)) for p in _modules() if "mcp" in _imports(p)) == [
        "mcp/connection.py"
    ]
    assert sorted(str(p.relative_to(PACKAGE)) for p in _modules() if "jsonschema" in _imports(p)) == [
        "mcp/toolset.py"
    ]
    import grimp

    graph = grimp.build_graph("chamvi_runs")
    mcp = {m for m in graph.modules if m == "chamvi_runs.mcp" or m.startswith("chamvi_runs.mcp.")}
    importers = set().union(*(graph.find_modules_that_directly_import(m) for m in mcp)) - mcp
    assert importers == set()


def test_importing_the_mcp_package_leaves_mcp_unimported():
    code = "import sys, chamvi_runs.mcp; print('mcp' in sys.modules, 'jsonschema' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


def test_only_the_agui_package_imports_ag_ui_and_the_urls_import_it_only_when_a_request_comes():
    """The ``agui`` extra is optional: the URLs every site includes name the endpoint, whose view
    imports the protocol's package on its first request (a 501 without it)."""
    assert sorted(str(p.relative_to(PACKAGE)) for p in _modules() if "ag_ui" in _imports(p)) == [
        "agui/inputs.py",
        "agui/translate.py",
    ]
    code = "import django; django.setup(); import chamvi_runs.urls, sys; print('ag_ui' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert out.stdout.split() == ["False"]


def test_no_module_imports_itself_back():
    """No import cycle, function-local imports included (they hid two before the layout had layers)."""
    import grimp

    graph = grimp.build_graph("chamvi_runs")
    ours = {m for m in graph.modules if not m.startswith("chamvi_runs.migrations")}
    cycles = []
    for module in sorted(ours):
        for imported in graph.find_modules_directly_imported_by(module) & ours:
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join([module, *back]))
    assert not cycles, "\n".join(cycles)


# --- writes of run state -----------------------------------------------------------------------


@dataclass
class _Scope:
    """What the names of one function (or module) are bound to: run state, or known not to be."""

    kinds: dict[str, str] = field(default_factory=dict)
    parent: _Scope | None = None

    def kind(self, name: str) -> str:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.kinds:
                return scope.kinds[name]
            scope = scope.parent
        return "unknown"


def _annotation_kind(annotation: ast.expr | None) -> str | None:
    if annotation is None:
        return None
    nodes = list(ast.walk(annotation))
    names = {n.id for n in nodes if isinstance(n, ast.Name)}
    names |= {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if any(re.search(rf"\b{model}\b", name) for name in names for model in RUN_STATE):
        return "run_state"
    if names & NOT_RUN_STATE:
        return "other"
    return None


class _WriteFinder(ast.NodeVisitor):
    """Calls that write run state: ``Run.objects.filter(...).update(...)``, ``run.steps.create()``,
    ``waitpoint.run.save()``, ``queryset.update()`` of a ``QuerySet[Run]``, ``obj.save()`` of an
    object of unknown type, and raw SQL that changes a run-state table."""

    def __init__(self) -> None:
        self.scope = _Scope()
        self.found: list[tuple[int, str]] = []

    def kind(self, node: ast.expr) -> str:
        """What an expression is rooted at, walking down ``a.b(...)[c].d`` to ``a``."""
        while True:
            if isinstance(node, ast.Attribute):
                if node.attr in RUN_STATE_ATTRIBUTES:
                    return "run_state"
                node = node.value
            elif isinstance(node, ast.Call):
                node = node.func
            elif isinstance(node, ast.Subscript):
                node = node.value
            elif isinstance(node, ast.Name):
                if node.id in RUN_STATE:
                    return "run_state"
                if node.id in NOT_RUN_STATE:
                    return "other"
                return self.scope.kind(node.id)
            elif isinstance(node, CONTAINERS):
                return "other"
            else:
                return "unknown"

    def _bind(self, target: ast.expr, kind: str) -> None:
        for name in ast.walk(target):
            if isinstance(name, ast.Name):
                self.scope.kinds[name.id] = kind

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.asname and alias.name in RUN_STATE | NOT_RUN_STATE:
                self.scope.kinds[alias.asname] = "run_state" if alias.name in RUN_STATE else "other"

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope = _Scope(parent=self.scope)
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            kind = _annotation_kind(arg.annotation)
            if kind:
                self.scope.kinds[arg.arg] = kind
        self.generic_visit(node)
        assert self.scope.parent is not None
        self.scope = self.scope.parent

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            self._bind(target, self.kind(node.value))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        kind = _annotation_kind(node.annotation) or (self.kind(node.value) if node.value else "unknown")
        self._bind(node.target, kind)

    def visit_For(self, node: ast.For) -> None:
        self._bind(node.target, self.kind(node.iter))
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._bind(node.target, self.kind(node.iter))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        if not isinstance(node.func, ast.Attribute) or node.func.attr not in WRITES:
            return
        kind = self.kind(node.func.value)
        unknown_write = kind == "unknown" and node.func.attr in FLAGGED_ON_UNKNOWN and not node.args
        if kind == "run_state" or unknown_write:
            self.found.append((node.lineno, ast.unparse(node)[:100]))

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and TABLES.search(node.value):
            self.found.append((node.lineno, node.value[:100]))


def run_state_writes(source: str) -> list[tuple[int, str]]:
    finder = _WriteFinder()
    finder.visit(ast.parse(source))
    return finder.found


@pytest.mark.parametrize(
    "source",
    [
        "def save_model(self, request, obj, form, change):\n    obj.save()",
        "def delete_model(self, request, obj):\n    obj.delete()",
        "Run.objects.filter(pk=1).update(status='running')",
        "Run.objects.filter(pk=1).select_for_update().update(claim_owner=None)",
        "Run._base_manager.filter(pk=1).update(attempt=0)",
        "runs = Run.objects.filter(agent='a')\nruns.update(status='failed')",
        "def action(self, request, queryset: QuerySet[Run]):\n    queryset.delete()",
        "def f(run: Run):\n    run.save(update_fields=['status'])",
        "def f(run: 'Run'):\n    run.steps.all().delete()",
        "def f(waitpoint):\n    waitpoint.run.save()",
        "def f(run):\n    run.checkpoint.delete()",
        "Step.objects.bulk_create([])",
        "Checkpoint.objects.update_or_create(run=run, defaults={})",
        "Thread.objects.get_or_create(name='t')",
        "RunInput.objects.create(run=run, payload=1)",
        "EffectRecord.objects.bulk_update([], ['output'])",
        "WaitPoint(run=run).save()",
        "from .models import Run as R\nR.objects.update(status='queued')",
        "for run in Run.objects.all():\n    run.delete()",
        "cursor.execute('UPDATE chamvi_runs_run SET status = %s', ['failed'])",
        "cursor.execute('delete from \"chamvi_runs_checkpoint\" where run_id = %s', [1])",
    ],
)
def test_the_checker_flags_writes_of_run_state(source):
    assert run_state_writes(source), source


@pytest.mark.parametrize(
    "source",
    [
        "artifact = Artifact(filename='a')\nartifact.file.save('a', data, save=False)\nartifact.save()",
        "ApiToken.objects.create(user=user, name='ci')",
        "ApiToken.objects.filter(pk=1).update(last_used_at=now)",
        "user, _ = get_user_model().objects.get_or_create(username='demo')\nuser.save()",
        "stream = client().chat.completions.create(model='m')",
        "connection.delete(key)",
        "default_storage.delete(name)",
        "fields = {'status': 'x'}\nfields.update(output=1)",
        "def f(**kwargs):\n    extra = dict(kwargs)\n    extra.update(a=1)",
        "Run.objects.filter(pk=1).first()",
        "cursor.execute('SELECT status FROM chamvi_runs_run')",
    ],
)
def test_the_checker_leaves_other_writes_alone(source):
    assert not run_state_writes(source), source


def test_only_the_store_writes_run_state():
    """Anywhere in the package and the bundled project, except the store's writers (migrations
    excluded; the store's read-only selections, ``store/queries.py``, write nothing either)."""
    sources = [*_modules(), *(ROOT / "project").rglob("*.py")]
    writers = {p for p in (PACKAGE / "store").glob("*.py") if p.name != "queries.py"}
    writes = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in sources
        if path not in writers and "migrations" not in path.parts
        for line, code in run_state_writes(path.read_text())
    ]
    assert not writes, "run state written outside chamvi_runs/store/:\n" + "\n".join(writes)


def test_the_admin_can_neither_add_change_nor_delete_run_state(django_user_model):
    """The admin writes without any call in our source (ModelAdmin.save_model calls obj.save()):
    every admin and inline of run state refuses, even to a superuser; actions are the way in."""
    from django.contrib import admin
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = django_user_model(username="root", is_staff=True, is_superuser=True, is_active=True)
    checked = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label != "chamvi_runs" or model.__name__ not in RUN_STATE:
            continue
        inlines = [inline(model, admin.site) for inline in model_admin.inlines]
        for each in [model_admin, *inlines]:
            name = type(each).__name__
            assert not each.has_add_permission(request, *([None] if each in inlines else [])), name
            assert not each.has_change_permission(request), name
            assert not each.has_delete_permission(request), name
            checked.append(name)
    assert {
        "RunAdmin",
        "StuckRunAdmin",
        "WaitPointAdmin",
        "CheckpointAdmin",
        "StepInline",
        "WaitPointInline",
    } <= set(checked)
