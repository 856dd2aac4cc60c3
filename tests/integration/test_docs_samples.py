"""Every fenced code block of README.md and docs/**/*.md is run by a test, or says why not.

The marker right before a block (tests/docsamples/__init__.py): ``<!-- sample: <name> -->`` names a
sample that a test takes with ``block("<name>")`` (or ``shell_commands``) and runs;
``<!-- not-run: <reason> -->`` excuses it. Python samples run in their context (settings applied
to a new startproject site, agents.py as a module, the Python API against the test database with
the README's scripted model), JSON samples are compared with what the API and the engine really
send (same keys, same types), shell samples run in tests/system/test_fresh_site.py; the chat page of
docs/chat-client.md is the bundled project's, which headless Chromium drives
(tests/system/browser/test_example_chat.py).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from chamvi_runs.errors import ToolArgumentsError
from tests.docsamples import ROOT, all_blocks, block, load_module
from tests.docsamples.myapp import installed
from tests.docsamples.site import check_clean, create_site, run, site_env
from tests.support.helpers import events, execute

# The files whose block(...) calls run samples.
RUNNERS = [
    ROOT / "tests" / "integration" / "test_docs_samples.py",
    ROOT / "tests" / "system" / "test_fresh_site.py",
    ROOT / "tests" / "integration" / "test_docs_first_hour.py",
    ROOT / "tests" / "system" / "test_docs_conversation.py",
    ROOT / "tests" / "integration" / "test_websocket_token.py",
    ROOT / "tests" / "integration" / "test_docs_delegation.py",
    ROOT / "tests" / "integration" / "test_responses_docs.py",
    ROOT / "tests" / "integration" / "test_tracing.py",
    ROOT / "tests" / "integration" / "test_mcp_tools.py",
    ROOT / "tests" / "integration" / "test_agui.py",
    ROOT / "tests" / "system" / "test_agui_client.py",
    ROOT / "tests" / "docsamples" / "site.py",
    ROOT / "tests" / "docsamples" / "myapp.py",
    ROOT / "tests" / "system" / "multihost" / "test_multihost.py",
]


TAKERS = ("block", "shell_commands", "_exec", "_json")


def _taken_samples() -> dict[str, list[str]]:
    """Sample name -> the runner files that take it: literal ``block("…")`` / ``shell_commands("…")``
    calls, and string defaults of parameters named like a sample (``settings="…"``)."""
    taken: dict[str, list[str]] = {}
    for path in RUNNERS:
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[Any] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in TAKERS:
                names = node.args[:1]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "create_site":
                names = [k.value for k in node.keywords if k.arg == "settings"]
            elif isinstance(node, ast.FunctionDef) and node.name == "create_site":
                names = node.args.defaults[-1:]
            for name in names:
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    taken.setdefault(name.value, []).append(path.name)
    return taken


def test_every_code_block_is_run_by_a_test_or_says_why_not() -> None:
    blocks = all_blocks()
    assert len(blocks) > 20
    unmarked = [b.where for b in blocks if b.marker is None]
    assert not unmarked, f"blocks without <!-- sample: name --> or <!-- not-run: reason -->: {unmarked}"
    unexcused = [b.where for b in blocks if b.marker == "not-run" and len(b.value) < 10]
    assert not unexcused, f"not-run blocks need a reason: {unexcused}"
    names = [b.value for b in blocks if b.marker == "sample"]
    assert len(names) == len(set(names)), f"sample names used twice: {sorted(names)}"
    taken = _taken_samples()
    untested = [f"{b.where} ({b.value})" for b in blocks if b.marker == "sample" and b.value not in taken]
    assert not untested, f"samples that no test runs: {untested}"
    assert not set(taken) - set(names), f"tests take samples the docs lack: {set(taken) - set(names)}"


def test_docs_point_only_inside_the_repository() -> None:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        assert "SPEC.md" not in text and "../shared" not in text, path
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code is not links
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", prose):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


# --- shapes ----------------------------------------------------------------------------------


def assert_same_shape(sample: Any, actual: Any, where: str = "$") -> None:
    """The same keys at every level, and the same JSON types where both are set (null is any type:
    a sample shows one moment of a run)."""
    if sample is None or actual is None:
        return
    if isinstance(sample, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not an object"
        assert set(sample) == set(actual), f"{where}: keys {sorted(sample)} != {sorted(actual)}"
        for key in sample:
            assert_same_shape(sample[key], actual[key], f"{where}.{key}")
    elif isinstance(sample, list):
        assert isinstance(actual, list), f"{where}: {actual!r} is not a list"
        if sample and actual:
            assert_same_shape(sample[0], actual[0], f"{where}[0]")
    elif isinstance(sample, int | float) and not isinstance(sample, bool):
        assert isinstance(actual, int | float) and not isinstance(actual, bool), f"{where}: {actual!r}"
    else:
        assert type(sample) is type(actual), f"{where}: {actual!r} is not a {type(sample).__name__}"


def _json(name: str) -> Any:
    return json.loads(block(name))


# --- the README's Python API, and the events it streams ---------------------------------------


@pytest.fixture
def readme_site(settings: Any, django_user_model: Any) -> Any:
    """The README's myapp with its scripted model; the user the README's samples look up."""
    with installed():
        settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MODEL": "myapp.scripted.SupportScript"}
        django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
        yield


def _exec(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(block(name), f"<{name}>", "exec"), namespace)
    return namespace


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_readme_python_samples_start_steer_decide_and_cancel(readme_site: Any) -> None:
    from chamvi_runs.models import RunInput
    from chamvi_runs.streaming.replay import rebuild

    ns = _exec("readme-python-start", {})
    run = ns["run"]
    assert run.status == "queued" and run.thread == f"support-{run.created_by_id}"
    _exec("readme-python-steer", ns)
    assert execute(run).status == "waiting"
    assert RunInput.objects.get(run=run).consumed_step == 0
    _exec("readme-python-decide", ns)
    ns["waitpoint"].refresh_from_db()
    assert ns["waitpoint"].decision == "approved" and ns["waitpoint"].reason == "under the limit"
    done = execute(run)
    assert done.status == "completed" and done.output.startswith("Done:")
    assert [s.name for s in done.steps.filter(kind="tool")] == ["lookup_order", "issue_refund"]

    # Every event type of the docs' stream, with exactly the fields the docs list.
    sample = _json("streaming-events")
    documented: dict[str, set[str]] = {}
    for event in sample:
        documented.setdefault(event["type"], set()).update(event)
    sent = events(run)
    for event in sent:
        assert set(event) == documented[event["type"]], f"{event['type']}: {sorted(event)}"
    assert {e["type"] for e in sent} == set(documented)
    for kind in ("run.resume", "run.end"):
        assert_same_shape(
            next(e for e in sample if e["type"] == kind), next(e for e in sent if e["type"] == kind)
        )
    resume = next(e for e in sent if e["type"] == "run.resume")
    assert resume["decision"]["decided_by"] == "admin"
    marker = rebuild(done).marker
    assert set(_json("streaming-truncated")) == {*marker, "seq"}

    # The cancel sample, on a second run of the thread that nobody executes yet.
    second = _exec("readme-python-start", ns)["run"]
    assert second.pk != run.pk
    _exec("readme-python-cancel", ns)
    assert ns["status"] == "cancelled"
    second.refresh_from_db()
    assert second.status == "cancelled"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_readme_python_samples_again_in_the_same_thread(readme_site: Any) -> None:
    """The README's thread, reused: the second run gets the first run's
    conversation, tool results included, and the README's script still looks the order up and asks
    for approval (it raised WaitPoint.DoesNotExist when it counted the thread's tool results)."""
    ns: dict[str, Any] = {}
    for number in (1, 2):
        run = _exec("readme-python-start", ns)["run"]
        assert execute(run).status == "waiting", number
        _exec("readme-python-decide", ns)
        done = execute(run)
        assert done.status == "completed" and done.output.startswith("Done:"), number
        assert [s.name for s in done.steps.filter(kind="tool")] == ["lookup_order", "issue_refund"]
    assert run.thread == f"support-{run.created_by_id}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_api_json_samples_are_what_the_api_returns(readme_site: Any, client: Any) -> None:
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="admin"))

    def post(path: str, body: Any) -> Any:
        return client.post(path, json.dumps(body), content_type="application/json")

    started = post("/chamvi/api/runs/", _json("api-start-request"))
    assert started.status_code == 201, started.content
    assert_same_shape(_json("api-run-response"), started.json())
    run_id = started.json()["id"]

    accepted = post(f"/chamvi/api/runs/{run_id}/input/", {"payload": "The box was damaged too."})
    assert accepted.status_code == 202
    assert_same_shape(_json("api-input-response"), accepted.json())

    assert execute(run_id).status == "waiting"
    detail = client.get(f"/chamvi/api/runs/{run_id}/").json()
    sample = _json("api-step-and-waiting")
    assert_same_shape(sample["steps"][0], detail["steps"][0])
    assert_same_shape(sample["waiting"], detail["waiting"])
    assert_same_shape(_json("api-run-response"), detail)

    decided = post(f"/chamvi/api/approvals/{detail['waiting']['approval_id']}/approve/", {"reason": "ok"})
    assert decided.status_code == 200
    assert_same_shape(_json("api-decision-response"), decided.json())
    again = post(f"/chamvi/api/approvals/{detail['waiting']['approval_id']}/approve/", {})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"


def test_http_api_doc_lists_every_endpoint_and_error_code() -> None:
    from chamvi_runs.urls import urlpatterns

    text = (ROOT / "docs" / "http-api.md").read_text()
    routes = re.sub(r"<[\w:]+>", "<>", text)
    for pattern in urlpatterns:
        route = re.sub(r"<[\w:]+>", "<>", str(pattern.pattern))
        assert f"`{route}" in routes or f" {route}`" in routes, f"docs/http-api.md does not document {route}"
    package = ROOT / "chamvi_runs"
    modules = [
        *(package / "web").glob("*.py"),
        *(package / "store").glob("*.py"),
        *(package / "agui").glob("*.py"),
    ]
    sources = "".join(path.read_text() for path in modules)
    codes = set(re.findall(r'\b(?:ApiError|AuthError|error)\(\s*\d{3},\s*"(\w+)"', sources))
    codes |= set(re.findall(r'\bcode="(\w+)"', sources))
    missing = sorted(c for c in codes if f"`{c}`" not in text)
    assert not missing, f"docs/http-api.md lacks error codes {missing}"


# --- agents, settings, checks ------------------------------------------------------------------


def test_agents_sample_uses_and_documents_every_agent_parameter() -> None:
    from chamvi_runs.agents.agent import Agent, registry

    parameters = [p for p in inspect.signature(Agent.__init__).parameters if p != "self"]
    table = (ROOT / "docs" / "agents.md").read_text()
    assert [p for p in parameters if f"| `{p}` |" not in table] == []
    try:
        module = load_module("docs_agents_sample", block("agents-every-parameter"))
        agent = registry.get("careful_support")
        assert agent is module.careful_support
        assert sorted(agent.assemble_tools(None)) == ["lookup_order", "refund"]  # type: ignore[arg-type]
        for parameter in parameters:
            assert f"    {parameter}=" in block("agents-every-parameter"), parameter
        assert agent.parse_output('{"refunded": true, "summary": "ok"}') == {
            "refunded": True,
            "summary": "ok",
        }
        # Delegated to, it takes what its input schema says, and refuses a call without it.
        delegated = agent.as_tool()
        assert delegated.schema()["function"]["parameters"]["required"] == ["order_id"]
        assert delegated.validate('{"order_id": "o-7", "note": "broken"}') == {
            "order_id": "o-7",
            "note": "broken",
        }
        with pytest.raises(ToolArgumentsError, match="order_id"):
            delegated.validate('{"note": "broken"}')
    finally:
        registry.unregister("careful_support")
        sys.modules.pop("docs_agents_sample", None)


def test_settings_sample_is_every_default_and_the_tables_are_complete() -> None:
    from chamvi_runs.conf import DEFAULTS

    assert _exec("settings-defaults", {})["CHAMVI_RUNS"] == DEFAULTS
    text = (ROOT / "docs" / "settings.md").read_text()
    keys = text.split("## Other settings")[0]
    assert set(re.findall(r"^\| `([A-Z_]+)` \|", keys, re.M)) == set(DEFAULTS)
    source = "".join((ROOT / "chamvi_runs" / name).read_text() for name in ("checks.py", "checks_deploy.py"))
    ids = set(re.findall(r'id="chamvi_runs\.([EW]\d{3})"', source)) | set(
        re.findall(r'"([EW]\d{3})"', source)
    )
    documented = set(re.findall(r"^\| `chamvi_runs\.([EW]\d{3})` \|", text, re.M))
    assert documented == ids


def test_deployment_channel_layer_sample_keeps_idle_websockets_open() -> None:
    from chamvi_runs.checks import check_channel_layers

    layers = _exec("deployment-channel-layer", {"REDIS_URL": os.environ["REDIS_URL"]})["CHANNEL_LAYERS"]
    with override_settings(CHANNEL_LAYERS=layers):
        assert check_channel_layers() == []


# --- settings snippets in a new site -----------------------------------------------------------


@pytest.mark.timeout(90)
def test_production_settings_check_clean_and_serve_collected_static(tmp_path: Path) -> None:
    env = {
        **site_env(),
        "OPENAI_API_KEY": "sk-test",
        "DJANGO_SECRET_KEY": "a-production-secret",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    }
    cwd = create_site(tmp_path, env, settings="readme-settings-production")
    check_clean(cwd, env)
    # Nor with the deployment checks: a queue of the site's own, no connection kept past a request.
    # (Django's own may fail a fresh startproject site: Django 6.1's mail.E001 is an error for its
    # console email backend. What is ours must say nothing.)
    deploy = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "SystemCheckError" in deploy.stderr or deploy.returncode == 0, deploy.stderr
    assert "chamvi_runs." not in deploy.stdout + deploy.stderr, deploy.stderr
    run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd, env)
    assert (cwd / "staticfiles" / "admin" / "css" / "base.css").exists()
    # Without DEBUG the ASGI application serves no static file itself: WhiteNoise does, from STATIC_ROOT.
    site = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    served = run([sys.executable, "-c", SERVE_STATIC], cwd, site)
    assert served.stdout.split() == ["200", "text/css"], served.stdout + served.stderr


SERVE_STATIC = """
from asgiref.sync import async_to_sync
from django.test import AsyncClient
import django
django.setup()
from django.conf import settings
assert not settings.DEBUG
response = async_to_sync(AsyncClient().get)("/static/admin/css/base.css")
print(response.status_code, response["Content-Type"].split(";")[0])
"""


@pytest.mark.timeout(90)
def test_own_router_asgi_starts_the_embedded_executor(tmp_path: Path) -> None:
    env = site_env()
    cwd = create_site(tmp_path, env)
    (cwd / "mysite" / "asgi.py").write_text(block("deployment-own-router"))
    check_clean(cwd, env)  # no W004: the router starts the executor
    unstarted = [
        line for line in block("deployment-own-router").splitlines() if not line.startswith("start_")
    ]
    (cwd / "mysite" / "asgi.py").write_text("\n".join(unstarted))
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert "chamvi_runs.W004" in checked.stdout + checked.stderr


# --- the testing page's pytest module, in a pytest of its own -----------------------------------

CONFTEST = """\
# The user's conftest: this test project plus the README's myapp (and its support agent).
from tests.docsamples.myapp import install

install()
"""


@pytest.mark.timeout(120)
def test_testing_page_sample_passes_under_pytest_django(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_support.py").write_text(block("testing-pytest"))
    # A database of its own, named after this run's: this process's test database is in use.
    database = os.environ["DATABASE_URL"].split("?", 1)[0] + "_docs_sample"
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider", "--create-db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


def test_the_chat_page_of_the_docs_is_the_one_the_browser_suite_drives() -> None:
    """docs/chat-client.md shows the bundled project's example page whole: a site author who copies
    the three pieces has what tests/system/browser/test_example_chat.py runs."""
    assert block("chat-page-html") == (ROOT / "templates" / "example" / "chat.html").read_text()
    assert block("chat-page-js") == (ROOT / "project" / "static" / "example" / "chat.js").read_text()
    urls = block("chat-page-url")
    chat_route = urls[urls.index('    path(\n        "example/chat/"') : urls.index("]\n")]
    assert chat_route in (ROOT / "project" / "urls.py").read_text()
