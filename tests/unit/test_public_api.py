"""docs/public-api.md says what a site may import: each of those names imports, and the docs written
for users name no internal module (the docs about how chamvi_runs works may)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import chamvi_runs

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_DOC = ROOT / "docs" / "public-api.md"
# The docs that explain how chamvi_runs works, for its contributors and the curious: they name
# internal modules on purpose.
INTERNALS_DOCS = {
    "architecture.md",
    "changelog.md",
    "developing.md",
    "durability.md",
    "effects.md",
    "performance.md",
    "public-api.md",
    "spec-notes.md",
}
INTERNAL = re.compile(
    r"chamvi_runs\.(?:core|store|runtime|dispatch|streaming|web|agents|conf|checks|checks_deploy"
    r"|templatetags|testing_store)(?:\.[A-Za-z_]+)*"
)
# Named in the user docs as what they are: a public function, and the loggers operators filter on.
ALLOWED = {"chamvi_runs.store.history"}
LOGGERS = {"chamvi_runs.web.consumers", "chamvi_runs.runtime.lease_keeper", "chamvi_runs.runtime.engine"}

PUBLIC = {
    "chamvi_runs": [*chamvi_runs.__all__],
    "chamvi_runs.errors": ["ChamviError", "DecisionRefused", "InvalidAnswer", "HistoryUnavailable"],
    "chamvi_runs.models": ["Run", "Step", "Checkpoint", "WaitPoint", "RunInput", "Thread"],
    "chamvi_runs.signals": [
        "run_started",
        "run_delta",
        "step_saved",
        "run_waiting",
        "run_settled",
        "execution_error",
        "events_sent",
    ],
    "chamvi_runs.policy": ["DefaultPolicy"],
    "chamvi_runs.urls": [],
    "chamvi_runs.routing": ["websocket_urlpatterns", "websocket_application"],
    "chamvi_runs.asgi": ["get_asgi_application", "start_embedded"],
    "chamvi_runs.llm_openai": ["OpenAIModel"],
    "chamvi_runs.llm_responses": ["ResponsesModel"],
    "chamvi_runs.testing": ["ScriptedModel", "ScriptedTurn"],
    "chamvi_runs.metrics": ["metrics_view"],
    "chamvi_runs.mcp": ["mcp_tools", "MCPTools", "MCPUnavailable", "MCPToolError", "IDEMPOTENCY_KEY"],
    "chamvi_runs.logs": ["JsonFormatter", "RunContextFilter"],
    "chamvi_runs.admin": ["RunAdmin", "StuckRunAdmin"],
    "chamvi_runs.worker": ["Worker"],
    "chamvi_runs.store": ["history"],
    "chamvi_runs.jobs": ["execute_run"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_imports_and_the_page_lists_it(module: str) -> None:
    page = PUBLIC_DOC.read_text()
    imported = importlib.import_module(module)
    assert f"`{module}" in page, f"docs/public-api.md lacks {module}"
    for name in PUBLIC[module]:
        assert hasattr(imported, name), f"{module}.{name}"
        assert f"`{name}`" in page or f"{module}.{name}" in page, f"docs/public-api.md lacks {module}.{name}"


def test_the_docs_for_users_name_no_internal_module() -> None:
    named = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if doc.name in INTERNALS_DOCS:
            continue
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            for path in INTERNAL.findall(line):
                if path in ALLOWED or (path in LOGGERS and "logger" in line.lower()):
                    continue
                if path in LOGGERS and doc.name == "operations.md":
                    continue  # the paragraph on lease-lost warnings names their loggers
                named.append(f"{doc.relative_to(ROOT)}:{number}: {path}")
    assert named == [], "user docs name internal modules (see docs/public-api.md):\n" + "\n".join(named)


@pytest.mark.parametrize("logger", sorted(LOGGERS))
def test_the_loggers_the_docs_name_exist(logger: str) -> None:
    # A logger is named after its module: a moved module renames it under the operators' filters.
    importlib.import_module(logger)
