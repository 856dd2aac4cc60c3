"""System checks of ``settings.CHAMVI_RUNS``: every documented id is reachable and names its key."""

import re
from datetime import timedelta

import pytest
from django.core.checks import Error
from django.core.checks import Warning as CheckWarning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import reverse_lazy

from chamvi_runs import checks
from chamvi_runs.checks import (
    check_channel_layer_exists,
    check_channel_layers,
    check_executor_runs_somewhere,
    check_login_url,
    check_settings,
)

pytestmark = pytest.mark.timeout(30)


def _override(settings, **values) -> None:
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, **values}


def _with_id(messages, id_: str) -> list:
    return [m for m in messages if m.id == f"chamvi_runs.{id_}"]


# (id, overrides of CHAMVI_RUNS, text the message must start with)
CASES = [
    ("W001", {"LEASE_SECOND": 30}, "CHAMVI_RUNS['LEASE_SECOND']"),
    ("E002", {"QUEUE": ""}, "CHAMVI_RUNS['QUEUE']"),
    ("E003", {"EXECUTOR": "celery"}, "CHAMVI_RUNS['EXECUTOR']"),
    ("E004", {"LEASE_SECONDS": 0}, "CHAMVI_RUNS['LEASE_SECONDS']"),
    ("E005", {"HEARTBEAT_SECONDS": -1}, "CHAMVI_RUNS['HEARTBEAT_SECONDS']"),
    ("E006", {"CANCEL_POLL_SECONDS": "1"}, "CHAMVI_RUNS['CANCEL_POLL_SECONDS']"),
    ("E007", {"APPROVAL_TTL": timedelta(0)}, "CHAMVI_RUNS['APPROVAL_TTL']"),
    ("E008", {"OPENAI": "sk-not-a-dict"}, "CHAMVI_RUNS['OPENAI']"),
    ("E009", {"POLICY": "chamvi_runs.policy.NoSuchPolicy"}, "CHAMVI_RUNS['POLICY']"),
    ("E010", {"STREAM_BUFFER_SECONDS": 0}, "CHAMVI_RUNS['STREAM_BUFFER_SECONDS']"),
    ("E011", {"MAX_PAYLOAD_BYTES": 0}, "CHAMVI_RUNS['MAX_PAYLOAD_BYTES']"),
    ("E012", {"QUEUE": "elsewhere"}, "CHAMVI_RUNS['QUEUE']"),
    ("E013", {"MODEL": "chamvi_runs.no_such_module.Model"}, "CHAMVI_RUNS['MODEL']"),
    ("E014", {"MODEL_BACKOFF_SECONDS": -0.5}, "CHAMVI_RUNS['MODEL_BACKOFF_SECONDS']"),
    ("E015", {"MAX_INVALID_TOOL_CALLS": 0}, "CHAMVI_RUNS['MAX_INVALID_TOOL_CALLS']"),
    ("E016", {"LEASE_SECONDS": 4, "HEARTBEAT_SECONDS": 3}, "CHAMVI_RUNS['HEARTBEAT_SECONDS']"),
    ("E017", {"MAX_ATTEMPTS": 0}, "CHAMVI_RUNS['MAX_ATTEMPTS']"),
    ("E019", {"CONCURRENCY": 0}, "CHAMVI_RUNS['CONCURRENCY']"),
    ("E020", {"STREAM_COALESCE_SECONDS": -0.001}, "CHAMVI_RUNS['STREAM_COALESCE_SECONDS']"),
    ("E025", {"MAX_INPUTS": 0}, "CHAMVI_RUNS['MAX_INPUTS']"),
    ("E028", {"MAX_CHILD_DEPTH": 0}, "CHAMVI_RUNS['MAX_CHILD_DEPTH']"),
    ("E029", {"VERSION_GRACE_SECONDS": -1}, "CHAMVI_RUNS['VERSION_GRACE_SECONDS']"),
    ("E030", {"TRACE_CONTENT": "yes"}, "CHAMVI_RUNS['TRACE_CONTENT']"),
    ("E031", {"RESPONSES_MODEL": "chamvi_runs.no_such_module.Model"}, "CHAMVI_RUNS['RESPONSES_MODEL']"),
    ("E026", {"MAX_PENDING_INPUT_BYTES": 1024}, "CHAMVI_RUNS['MAX_PENDING_INPUT_BYTES']"),
]


def test_test_settings_produce_no_messages():
    assert check_settings() == []


@pytest.mark.parametrize(("id_", "overrides", "prefix"), CASES, ids=[c[0] for c in CASES])
def test_each_check_id_names_its_key(settings, id_, overrides, prefix):
    assert check_settings() == []
    _override(settings, **overrides)
    found = _with_id(check_settings(), id_)
    assert len(found) == 1, check_settings()
    assert found[0].msg.startswith(prefix), found[0].msg
    expected_class = CheckWarning if id_.startswith("W") else Error
    assert type(found[0]) is expected_class


def test_every_documented_id_has_a_case():
    documented = set(re.findall(r"^([EW]\d{3})\s", checks.__doc__, flags=re.MULTILINE))
    assert documented == {c[0] for c in CASES} | {"E001", "W002", "W003", "E018", "W004", "W005", "W006"}


def test_e001_not_a_dict(settings):
    settings.CHAMVI_RUNS = [("QUEUE", "chamvi")]
    messages = check_settings()
    assert [m.id for m in messages] == ["chamvi_runs.E001"]
    assert "CHAMVI_RUNS must be a dict" in messages[0].msg


def test_w002_worker_class(settings):
    settings.RQ = {}
    found = _with_id(check_settings(), "W002")
    assert len(found) == 1
    assert "RQ['WORKER_CLASS']" in found[0].msg
    assert isinstance(found[0], CheckWarning)


def test_thread_executor_needs_no_rq_queue_or_worker(settings):
    settings.RQ = {}
    settings.RQ_QUEUES = {}
    _override(settings, EXECUTOR="thread")
    assert check_settings() == []
    _override(settings, EXECUTOR="rq")
    assert {m.id for m in check_settings()} == {"chamvi_runs.E012", "chamvi_runs.W002"}


def test_heartbeat_not_positive_is_e005_only(settings):
    # Not positive and "more than half the lease" are different problems with different ids.
    _override(settings, HEARTBEAT_SECONDS=0)
    assert {m.id for m in check_settings()} == {"chamvi_runs.E005"}


def test_heartbeat_exactly_half_the_lease_is_fine(settings):
    _override(settings, LEASE_SECONDS=4, HEARTBEAT_SECONDS=2)
    assert check_settings() == []
    _override(settings, HEARTBEAT_SECONDS=2.5)
    [error] = check_settings()
    assert error.id == "chamvi_runs.E016"
    assert "LEASE_SECONDS" in error.msg


@pytest.mark.parametrize("value", [True, 0, -3, "30", None, float("nan")])
def test_lease_seconds_rejects_non_positive_numbers(settings, value):
    _override(settings, LEASE_SECONDS=value)
    assert _with_id(check_settings(), "E004")


@pytest.mark.parametrize("value", [timedelta(hours=1), 3600, 0.5])
def test_approval_ttl_accepts_timedelta_and_seconds(settings, value):
    _override(settings, APPROVAL_TTL=value)
    assert check_settings() == []


@pytest.mark.parametrize("value", [timedelta(seconds=-1), 0, "24h", True])
def test_approval_ttl_rejects(settings, value):
    _override(settings, APPROVAL_TTL=value)
    assert _with_id(check_settings(), "E007")


@pytest.mark.parametrize(
    ("openai", "option"),
    [
        ({"api_key": "k", "organization": "x"}, "organization"),
        ({"max_retries": -1}, "['max_retries']"),
        ({"max_retries": True}, "['max_retries']"),
        ({"max_retries": 1.5}, "['max_retries']"),
        ({"timeout": 0}, "['timeout']"),
        ({"api_key": 123}, "['api_key']"),
        ({"base_url": ["http://x"]}, "['base_url']"),
    ],
)
def test_openai_options(settings, openai, option):
    _override(settings, OPENAI=openai)
    [error] = check_settings()
    assert error.id == "chamvi_runs.E008"
    assert error.msg.startswith("CHAMVI_RUNS['OPENAI']")
    assert option in error.msg


def test_openai_good_options(settings):
    _override(
        settings,
        OPENAI={"api_key": "k", "base_url": "http://127.0.0.1:1/v1", "timeout": 5, "max_retries": 0},
    )
    assert check_settings() == []


@pytest.mark.parametrize(("key", "id_"), [("MODEL", "E013"), ("POLICY", "E009"), ("RESPONSES_MODEL", "E031")])
@pytest.mark.parametrize("value", [123, None, "nodots", "chamvi_runs.conf.NoSuchName"])
def test_import_paths_never_crash_the_check(settings, key, id_, value):
    _override(settings, **{key: value})
    [error] = check_settings()
    assert error.id == f"chamvi_runs.{id_}"
    assert error.msg.startswith(f"CHAMVI_RUNS['{key}']")


@pytest.mark.parametrize("value", [1.5, True, "256", -1])
def test_max_payload_bytes_must_be_an_int(settings, value):
    _override(settings, MAX_PAYLOAD_BYTES=value)
    assert _with_id(check_settings(), "E011")


def test_unknown_keys_of_any_type_are_warnings(settings):
    _override(settings, **{"EXECUTER": "rq"})
    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, 1: "x"}
    messages = check_settings()
    assert sorted(m.msg for m in messages) == [
        "CHAMVI_RUNS['1'] is not a known setting",
        "CHAMVI_RUNS['EXECUTER'] is not a known setting",
    ]
    assert all(m.id == "chamvi_runs.W001" for m in messages)


def test_manage_py_check_fails_for_a_wrong_executor(settings):
    call_command("check")  # the test settings pass
    _override(settings, EXECUTOR="celery")
    with pytest.raises(SystemCheckError) as info:
        call_command("check")
    assert "chamvi_runs.E003" in str(info.value)
    assert "CHAMVI_RUNS['EXECUTOR']" in str(info.value)


def _redis_layer(*hosts) -> dict:
    return {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": list(hosts)}}}


def test_the_bundled_channel_layer_outlives_the_blocking_pop():
    # The project's CHANNEL_LAYERS (REDIS_URL is set for the tests): no warning.
    assert check_channel_layers() == []


@pytest.mark.parametrize(
    "host",
    [
        "redis://127.0.0.1:6379/12",  # redis-py 8's default read timeout: 5 s
        ("127.0.0.1", 6379),
        {"address": "redis://127.0.0.1:6379/12", "socket_timeout": 5},
        "redis://127.0.0.1:6379/12?socket_timeout=8",
    ],
    ids=["url", "tuple", "dict-5s", "url-query-8s"],
)
def test_w003_a_layer_whose_reads_time_out_before_the_pop_is_warned(settings, host):
    settings.CHANNEL_LAYERS = _redis_layer(host)
    [warning] = check_channel_layers()
    assert type(warning) is CheckWarning and warning.id == "chamvi_runs.W003"
    assert warning.msg.startswith("CHANNEL_LAYERS['default']") and "1011" in warning.msg
    assert "socket_timeout" in warning.hint


@pytest.mark.parametrize(
    "host",
    [
        {"address": "redis://127.0.0.1:6379/12", "socket_timeout": 30},
        {"address": "redis://127.0.0.1:6379/12", "socket_timeout": None},
        "redis://127.0.0.1:6379/12?socket_timeout=10",
    ],
)
def test_w003_long_or_no_read_timeouts_are_fine(settings, host):
    settings.CHANNEL_LAYERS = _redis_layer(host)
    assert check_channel_layers() == []


def test_w003_other_layers_are_not_checked(settings):
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
        "broken": {"BACKEND": "no.such.Layer"},
    }
    assert check_channel_layers() == []


def test_w003_is_reported_by_manage_py_check(settings, capsys):
    settings.CHANNEL_LAYERS = _redis_layer("redis://127.0.0.1:6379/12")
    call_command("check")  # a warning does not fail the command
    assert "chamvi_runs.W003" in capsys.readouterr().err


def _site_messages() -> list:
    return check_channel_layer_exists() + check_executor_runs_somewhere() + check_login_url()


def test_test_settings_produce_no_site_messages():
    assert _site_messages() == []


@pytest.mark.parametrize("layers", [None, {}, {"other": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}])
def test_e018_no_default_channel_layer(settings, layers):
    # Without it every websocket crashed at connect ('NoneType' has no attribute 'group_add') and
    # the run page reconnected every second.
    if layers is None:
        del settings.CHANNEL_LAYERS
    else:
        settings.CHANNEL_LAYERS = layers
    found = _with_id(check_channel_layer_exists(), "E018")
    assert len(found) == 1 and type(found[0]) is Error
    assert "CHANNEL_LAYERS" in found[0].msg and "InMemoryChannelLayer" in found[0].hint


@pytest.fixture
def embedded_not_requested(monkeypatch):
    """The process-wide record of start_embedded() calls, as in a process that never made one."""
    from chamvi_runs.runtime import embedded

    monkeypatch.setattr(embedded._embedded, "requested", False)
    monkeypatch.setattr(embedded._embedded, "started", False)


def test_w004_thread_executor_that_nothing_starts(settings, embedded_not_requested):
    _override(settings, EXECUTOR="thread")
    settings.ASGI_APPLICATION = "tests.testapp.asgi_without_executor.application"
    found = _with_id(check_executor_runs_somewhere(), "W004")
    assert len(found) == 1 and type(found[0]) is CheckWarning
    assert "queued" in found[0].msg and "get_asgi_application" in found[0].hint
    del settings.ASGI_APPLICATION
    assert len(_with_id(check_executor_runs_somewhere(), "W004")) == 1


def test_w004_quiet_for_an_application_that_starts_it_and_the_check_starts_no_thread(
    settings, embedded_not_requested
):
    import threading

    from chamvi_runs.runtime import embedded

    _override(settings, EXECUTOR="thread")
    before = {t.name for t in threading.enumerate()}
    for path in ("project.asgi.application", "tests.testapp.asgi_with_start_embedded.application"):
        settings.ASGI_APPLICATION = path
        assert check_executor_runs_somewhere() == [], path
    # manage.py migrate runs the checks: importing the application there must execute nothing.
    assert not embedded._embedded.started
    assert {t.name for t in threading.enumerate()} - before == set()


def test_w004_not_for_the_rq_executor(settings, embedded_not_requested):
    settings.ASGI_APPLICATION = "tests.testapp.asgi_without_executor.application"
    assert check_executor_runs_somewhere() == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_w006_rq_executor_on_sqlite(settings):
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    # Another alias on SQLite is none of chamvi's business: runs are written to the default one.
    settings.DATABASES = {**settings.DATABASES, "other": sqlite}
    assert check_executor_runs_somewhere() == []
    settings.DATABASES = {**settings.DATABASES, "default": sqlite}
    found = _with_id(check_executor_runs_somewhere(), "W006")
    assert len(found) == 1 and "PostgreSQL" in found[0].msg
    _override(settings, EXECUTOR="thread")
    settings.ASGI_APPLICATION = "project.asgi.application"
    assert _with_id(check_executor_runs_somewhere(), "W006") == []


@pytest.mark.parametrize(
    ("login_url", "shown"),
    [
        ("/accounts/login/", "/accounts/login/"),
        ("accounts:login", "accounts:login"),
        ("/chamvi/nowhere/", "/chamvi/nowhere/"),
        (reverse_lazy("nope:login"), "__proxy__"),
        (None, "NoneType"),
    ],
)
def test_w005_login_url_that_resolves_nowhere(settings, login_url, shown):
    settings.LOGIN_URL = login_url
    found = _with_id(check_login_url(), "W005")
    assert len(found) == 1 and shown in found[0].msg, check_login_url()


@pytest.mark.parametrize(
    "login_url",
    ["/admin/login/", "admin:login", reverse_lazy("admin:login"), "https://sso.example.com/login"],
)
def test_w005_quiet_for_a_login_url_that_resolves(settings, login_url):
    settings.LOGIN_URL = login_url
    assert check_login_url() == []


# --- how the site is served (chamvi_runs/checks_deploy.py) -------------------------------------


def _served_messages() -> list:
    from chamvi_runs.checks_deploy import check_persistent_connections, check_wildcard_host

    return check_persistent_connections() + check_wildcard_host()


def test_every_documented_serving_id_is_tested():
    from chamvi_runs import checks_deploy

    documented = set(re.findall(r"^([EW]\d{3})\s", checks_deploy.__doc__, flags=re.MULTILINE))
    assert documented == {"E027", "W007", "W008", "W009"}


def test_test_settings_serve_without_messages():
    # The bundled project: CONN_MAX_AGE 0, its hosts listed.
    assert _served_messages() == []


def _keep_connections(settings, age) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {**settings.DATABASES["default"], "CONN_MAX_AGE": age},
    }


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("age", [500, None])
def test_e027_persistent_connections_under_asgi_without_debug(settings, age):
    # bakerydemo's dj_database_url default (500) under daphne: "too many clients" for the whole server.
    settings.DEBUG = False
    _keep_connections(settings, age)
    [error] = _served_messages()
    assert type(error) is Error and error.id == "chamvi_runs.E027"
    assert error.msg.startswith(f"DATABASES['default']['CONN_MAX_AGE'] is {age!r}")
    assert "too many clients" in error.msg
    assert 'DATABASES["default"]["CONN_MAX_AGE"] = 0' in error.hint and '["pool"] = True' in error.hint
    with pytest.raises(SystemCheckError, match=r"chamvi_runs\.E027"):
        call_command("check")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_w007_persistent_connections_under_asgi_with_debug(settings, capsys):
    settings.DEBUG = True
    _keep_connections(settings, 60)
    [warning] = _served_messages()
    assert type(warning) is CheckWarning and warning.id == "chamvi_runs.W007"
    assert "CONN_MAX_AGE" in warning.msg and 'CONN_MAX_AGE"] = 0' in warning.hint
    call_command("check")  # a warning in development: runserver still starts
    assert "chamvi_runs.W007" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_persistent_connections_outside_asgi_or_at_zero_are_fine(settings):
    settings.DEBUG = False
    _keep_connections(settings, 0)
    assert _served_messages() == []
    _keep_connections(settings, 500)
    del settings.ASGI_APPLICATION  # a WSGI site: its connections are its own business
    assert _served_messages() == []


@pytest.mark.parametrize("hosts", [["*"], ["example.com", "*"]])
def test_w008_wildcard_allowed_hosts_without_debug(settings, hosts):
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = hosts
    [warning] = _served_messages()
    assert type(warning) is CheckWarning and warning.id == "chamvi_runs.W008"
    assert warning.msg.startswith("settings.ALLOWED_HOSTS contains '*'") and "websockets" in warning.msg
    assert "CSRF_TRUSTED_ORIGINS" in warning.hint and "ALLOWED_HOSTS" in warning.hint


@pytest.mark.parametrize(("debug", "hosts"), [(True, ["*"]), (False, ["example.com", ".example.com"])])
def test_w008_quiet_in_development_or_for_listed_hosts(settings, debug, hosts):
    settings.DEBUG = debug
    settings.ALLOWED_HOSTS = hosts
    assert _served_messages() == []


def _deploy_ids() -> set[str]:
    from django.core.checks import run_checks

    return {m.id for m in run_checks(include_deployment_checks=True)}


def test_w009_default_queue_name_under_check_deploy_only(settings):
    from django.core.checks import run_checks

    assert "chamvi_runs.W009" in _deploy_ids()  # the test settings keep "chamvi"
    [warning] = [m for m in run_checks(include_deployment_checks=True) if m.id == "chamvi_runs.W009"]
    assert type(warning) is CheckWarning and warning.msg.startswith("CHAMVI_RUNS['QUEUE']")
    assert "rqworker mysite" in warning.hint
    assert "chamvi_runs.W009" not in {m.id for m in run_checks()}  # not in every command
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "mysite": settings.RQ_QUEUES["chamvi"]}
    _override(settings, QUEUE="mysite")
    assert "chamvi_runs.W009" not in _deploy_ids()
    _override(settings, QUEUE="chamvi", EXECUTOR="thread")  # embedded mode has no queue
    assert "chamvi_runs.W009" not in _deploy_ids()
