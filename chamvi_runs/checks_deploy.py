"""System checks of how a site serves chamvi_runs: what adding it to existing sites ran into.

=========  ==================================================================
id         problem
=========  ==================================================================
E027       a database keeps connections (``CONN_MAX_AGE`` not 0) in a site served over ASGI, with
           ``DEBUG`` off: the web process piles up idle connections until PostgreSQL refuses more
W007       the same with ``DEBUG`` on
W008       ``ALLOWED_HOSTS`` contains ``"*"`` with ``DEBUG`` off: any Host is accepted
W009       (``check --deploy`` only) ``QUEUE`` is left at ``"chamvi"`` with the ``rq`` executor:
           two sites on one Redis would share it
=========  ==================================================================

Every ``manage.py`` command runs the first three, RQ workers and ``chamvi_tick`` included, which
are not served over ASGI: they need no setting of their own, since ``CONN_MAX_AGE = 0`` costs them
nothing (``chamvi_runs.worker.Worker`` keeps its threads' connections anyway, and ``chamvi_tick``
opens one per pass, every 5 s).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .conf import DEFAULTS


@register(Tags.compatibility)
def check_persistent_connections(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """E027 / W007: under ASGI, Django runs each request's sync code (views, middleware) in a
    thread of its own; a connection kept past the request stays with the finished thread until the
    garbage collector happens to free it. bench/conn_leak/: 240 page loads left 10 to 19 idle
    connections behind with ``CONN_MAX_AGE = 500`` (up to 21 at once), none with 0, two with
    Django's pool."""
    if not getattr(settings, "ASGI_APPLICATION", None):
        return []  # not served over ASGI: persistent connections are the site's business
    messages: list[Error | Warning] = []
    for alias, database in (getattr(settings, "DATABASES", None) or {}).items():
        if not isinstance(database, dict):
            continue
        age = database.get("CONN_MAX_AGE", 0)
        if age == 0:
            continue
        level, id_ = (Warning, "W007") if settings.DEBUG else (Error, "E027")
        messages.append(
            level(
                f"DATABASES['{alias}']['CONN_MAX_AGE'] is {age!r} in a site served over ASGI (daphne): "
                "each request runs in a thread of its own, and a connection kept past the request stays "
                "open with the finished thread, so the web process piles up idle connections until "
                'PostgreSQL refuses more ("too many clients")',
                hint=f'Set DATABASES["{alias}"]["CONN_MAX_AGE"] = 0 for the processes that serve ASGI (RQ '
                "workers keep their connections anyway). To reuse connections, add Django's pool: "
                f'DATABASES["{alias}"]["OPTIONS"]["pool"] = True (PostgreSQL, psycopg 3), with '
                "CONN_MAX_AGE 0.",
                id=f"chamvi_runs.{id_}",
            )
        )
    return messages


@register(Tags.security)
def check_wildcard_host(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W008: with ``"*"`` Django accepts any Host. The websockets compare a browser's Origin with
    the Host it sent (or ``CSRF_TRUSTED_ORIGINS``), which holds against another site's page; but a
    site should say which hosts are its own, and a front end on another origin belongs in
    ``CSRF_TRUSTED_ORIGINS``. In development (``DEBUG``) ``"*"`` is common and harmless."""
    hosts = getattr(settings, "ALLOWED_HOSTS", None) or []
    if settings.DEBUG or not getattr(settings, "ASGI_APPLICATION", None) or "*" not in hosts:
        return []
    return [
        Warning(
            "settings.ALLOWED_HOSTS contains '*': any Host is accepted, for pages and for the chamvi_runs "
            "websockets, whose Origin check then rests on whatever Host each request names",
            hint="List your site's hosts in ALLOWED_HOSTS (e.g. ['example.com', '.example.com']). A front "
            "end on another origin that opens sockets goes in CSRF_TRUSTED_ORIGINS "
            "(e.g. ['https://app.example.com']).",
            id="chamvi_runs.W008",
        )
    ]


@register(Tags.compatibility, deploy=True)
def check_queue_name(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W009, with ``manage.py check --deploy``: two sites whose workers share a Redis and a queue
    name take each other's jobs. Workers put another site's job back (and log an error), but each
    site's runs wait while the other's workers hold them; a queue named after the site avoids it.
    Not in every command: most sites have a Redis of their own."""
    user = getattr(settings, "CHAMVI_RUNS", {})
    value = {**DEFAULTS, **(user if isinstance(user, dict) else {})}
    if value["EXECUTOR"] != "rq" or value["QUEUE"] != DEFAULTS["QUEUE"]:
        return []
    return [
        Warning(
            f"CHAMVI_RUNS['QUEUE'] is the default {DEFAULTS['QUEUE']!r}: the workers of two sites on one "
            "Redis would take each other's jobs (each puts the other's back, and logs an error)",
            hint='Name the queue after the site: CHAMVI_RUNS["QUEUE"] = "mysite", RQ_QUEUES = {"mysite": '
            "{...}}, and start the workers with `manage.py rqworker mysite`; or give each site a Redis "
            "database of its own.",
            id="chamvi_runs.W009",
        )
    ]
