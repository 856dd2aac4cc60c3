# make demo: embedded mode (SQLite, in-memory channel layer, in-process executor, offline model).
# make check: the inner loop, no server needed: lint, formatting, layers, types and tests/unit.
# make test: the whole suite against PostgreSQL and Redis (DATABASE_URL / REDIS_URL, default 127.0.0.1).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
CKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The demo installs what it runs: the package and its dependencies, without compiling every module
# ahead (Python compiles what it imports). Everything else also needs the test, lint and browser
# tools (the dev extra, a minute more).
BASE := $(VENV)/.installed-base-$(CKSUM)
DEV := $(VENV)/.installed-dev-$(CKSUM)
# The venv gets no pip of its own until the dev tools need one (ensurepip: some 10 s): the pip of
# $(PYTHON) installs into it (pip 22.3+, --python). A $(PYTHON) without such a pip gives the venv its own.
HOST_PIP := $(shell $(PYTHON) -m pip --help 2>/dev/null | grep -q -- '--python <python>' && echo yes)
PIP := $(if $(HOST_PIP),$(PYTHON) -m pip --python $(PY),$(PY) -m pip)

.PHONY: demo lint check test test-django6 soak bench bench-overhead bench-long bench-mcp worker tick clean screenshots

$(PY):
	$(PYTHON) -m venv $(if $(HOST_PIP),--without-pip) $(VENV)

$(BASE): $(PY) pyproject.toml
	$(PIP) install --quiet --no-compile -e .
	touch $(BASE)

$(DEV): $(PY) pyproject.toml
	$(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip --upgrade
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(DEV) $(BASE)

demo: $(BASE)
	$(PY) manage.py chamvi_demo_user --migrate
	@echo "Serving on http://127.0.0.1:$(PORT)/ (Ctrl-C to stop)"
	$(PY) -m daphne -b 127.0.0.1 -p $(PORT) project.asgi:application

# What both check and test run first. `ruff format` covers the Python samples of README.md and docs/ too.
lint: $(DEV)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m mypy chamvi_runs

# The unit tier needs no PostgreSQL or Redis (tests/unit/conftest.py refuses a test that asks for one).
check: lint
	$(PY) -m pytest tests/unit -q -p no:cacheprovider

# The whole suite includes tests/unit: it runs once, here, not after check. tests/lanes.py runs the
# system tier beside the others, with a database of its own, then what restarts the servers alone.
test: lint
	$(PY) manage.py makemigrations --check --dry-run --settings=tests.settings
	$(PY) -m tests.lanes

# The newest Django the pins allow (6.x needs Python 3.12+), in a venv of its own: the suite's
# tests of what touches Django (checks, admin, pages, HTTP, websockets, SSE, the engine, migrations,
# retention, metrics, logs, the documented samples). PYTHON6 names a Python 3.12+.
PYTHON6 ?= python3.12
VENV6 := .venv-django6
PY6 := $(VENV6)/bin/python
DJANGO6_TESTS := tests/unit/test_checks.py tests/unit/test_migrations.py \
	$(addprefix tests/integration/,test_admin.py test_admin_stuck.py test_pages.py test_http_api.py \
		test_http_bad_input.py test_http_scoping.py test_websocket.py test_sse.py test_engine_basics.py \
		test_engine_failures.py test_approvals_and_effects.py test_claims_and_steering.py test_prune.py \
		test_metrics.py test_logs.py test_docs_samples.py test_conversation_http.py test_history_parts.py) \
	tests/system/test_asgi_app.py tests/system/test_fresh_site.py

test-django6:
	test -x $(PY6) || $(PYTHON6) -m venv $(VENV6)
	$(PY6) -m pip install --quiet --upgrade pip
	$(PY6) -m pip install --quiet -e '.[test]' 'django>=6,<6.2'
	$(PY6) -c 'import django; assert django.VERSION >= (6,), django.__version__; print("Django", django.__version__)'
	$(PY6) manage.py makemigrations --check --dry-run --settings=tests.settings
	$(PY6) -m pytest $(DJANGO6_TESTS)

# The fault-injection suite at SCALE times its CI size (default 5: 250 randomly killed runs, ...).
SCALE ?= 5
soak: $(DEV)
	CHAMVI_FAULT_SCALE=$(SCALE) $(PY) -m pytest tests/system/faults

# The PNGs of docs/screenshots/, taken by the browser suite (headless Chromium) as it goes.
screenshots: $(DEV)
	CHAMVI_SCREENSHOTS=docs/screenshots $(PY) -m pytest tests/system/browser -q

# chamvi_runs beside the bare openai calls, raw SQL, LangGraph and DBOS (docs/benchmarks.md and .png).
# The peers and matplotlib go into venvs of their own under $CHAMVI_BENCH_HOME, never into $(VENV).
# BENCH_ARGS passes options, e.g. make bench BENCH_ARGS="--systems bare,chamvi --reps 1".
bench: $(DEV)
	$(PY) -m bench.compare $(BENCH_ARGS)

# The engine's in-process overhead against the bare openai client (docs/performance.md).
bench-overhead: $(DEV)
	$(PY) -m bench.overhead

# A step's cost as a run grows to 20, 100 and 200 tool turns (docs/performance.md).
bench-long: $(DEV)
	$(PY) -m bench.long_run

# An MCP tool call on the kept session against a fresh connection per call (docs/mcp.md).
bench-mcp: $(DEV)
	$(PY) -m bench.mcp_calls

worker: $(BASE)
	$(PY) manage.py rqworker chamvi

tick: $(BASE)
	$(PY) manage.py chamvi_tick

clean:
	rm -rf $(VENV) $(VENV6) db.sqlite3 media
