"""The JSON HTTP API (SPEC §7). Errors are ``{"error": {"code", "message"}}`` with a fitting 4xx."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables

from .. import api, store
from ..conf import conf
from ..core.branches import current_branch
from ..core.numbers import ascii_int
from ..core.storable import unstorable
from ..errors import (
    AgentNotFound,
    ChamviError,
    DecisionRefused,
    HistoryUnavailable,
    InputRefused,
    InvalidPayload,
    RunNotFound,
    ThreadForbidden,
)
from ..models import Run
from ..policy import policy
from ..streaming.serializers import (
    MAX_STEPS_LIMIT,
    STEPS_LIMIT,
    StepWindow,
    branch_run_json,
    run_json,
    waitpoint_json,
)
from . import threads
from .approvals import answer, decide
from .auth import authenticate
from .errors import ApiError, unauthenticated


def error(status: int, code: str, message: str) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="chamvi"'
    return response


View = Callable[..., HttpResponseBase]


def api_view(*methods: str) -> Callable[[View], View]:
    def decorate(view: View) -> View:
        @csrf_exempt  # CSRF is enforced in authenticate() for session requests, not for bearer tokens.
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method not in methods:
                response = error(
                    405,
                    "method_not_allowed",
                    f"{request.method} is not allowed here; use {', '.join(methods)}",
                )
                response["Allow"] = ", ".join(methods)
                return response
            try:
                request.api_user = authenticate(request)  # type: ignore[attr-defined]
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.code, exc.message)

        return wrapper

    return decorate


def _require_user(request: HttpRequest) -> Any:
    user = request.api_user  # type: ignore[attr-defined]
    if not user.is_authenticated:
        raise unauthenticated()
    return user


def _raw_body(request: HttpRequest, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the body: a chunked body has no Content-Length to refuse
    early, and ``request.body`` would hold all of it in memory."""
    if hasattr(request, "_body"):
        # Already read whole, by the CSRF check of an urlencoded form (bounded by Django's
        # DATA_UPLOAD_MAX_MEMORY_SIZE).
        return request.body
    if request._read_started:  # type: ignore[attr-defined]
        # A multipart form whose stream was already parsed (e.g. for its CSRF field): not JSON.
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    return request.read(limit + 1)


def _body(request: HttpRequest, limit: int | None = None) -> dict[str, Any]:
    """The JSON object of the body; ``limit``: its bytes at most (by default the payload cap plus
    room for the envelope's other fields)."""
    limit = limit or conf.MAX_PAYLOAD_BYTES + 16 * 1024
    declared = request.headers.get("Content-Length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    raw = _raw_body(request, limit)
    if len(raw) > limit:
        raise ApiError(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ApiError(400, "invalid_json", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_body", "the body must be a JSON object")
    return data


MAX_QUERY_INT = 2**31 - 1
# How many runs of a thread's branch (and of its replaced runs) its JSON lists.
THREAD_RUNS = 200


def query_int(
    request: HttpRequest, name: str, *, minimum: int = 0, maximum: int = MAX_QUERY_INT
) -> int | None:
    """The query parameter ``name`` as an int, None when absent. Only ASCII digits (core.numbers)."""
    raw = request.GET.get(name)
    if raw is None:
        return None
    value = ascii_int(raw)
    if value is None or not minimum <= value <= maximum:
        raise ApiError(400, "invalid_field", f"'{name}' must be an integer from {minimum} to {maximum}")
    return value


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value or len(value) > 200):
        raise ApiError(400, "invalid_field", f"'{key}' must be a non-empty string of at most 200 characters")
    return value


def _run_for(request: HttpRequest, run_id: str, *, steer: bool = False, cancel: bool = False) -> Run:
    user = _require_user(request)
    # PostgreSQL refuses a NUL or a lone surrogate in any text it is sent, a lookup's too: no run has
    # one in its id.
    run = None if unstorable(run_id) else Run.objects.filter(pk=run_id).first()
    if run is None or not policy().can_view(user, run):
        raise ApiError(404, "not_found", f"no run {run_id}")
    if steer and not policy().can_steer(user, run):
        raise ApiError(403, "forbidden", "you may not steer this run")
    if cancel and not policy().can_cancel(user, run):
        raise ApiError(403, "forbidden", "you may not cancel this run")
    return run


@api_view("POST")
def runs(request: HttpRequest) -> HttpResponse:
    user = _require_user(request)
    data = _body(request)
    unknown = sorted(set(data) - {"agent", "payload", "thread", "concurrency_key", "keys", "id", "from_step"})
    if unknown:
        raise ApiError(400, "invalid_field", f"unknown fields: {', '.join(unknown)}")
    agent = data.get("agent")
    if not isinstance(agent, str) or not agent:
        raise ApiError(400, "invalid_field", "'agent' is required and must be a string")
    if not policy().can_start(user, agent):
        raise ApiError(403, "forbidden", f"you may not start {agent}")
    keys = data.get("keys")
    if keys is not None and not isinstance(keys, dict):
        raise ApiError(400, "invalid_field", "'keys' must be an object")
    from_step = _from_step(request, data.get("from_step"))
    run = start_as(
        user,
        agent,
        data.get("payload"),
        source="http",
        trigger="http",
        keys=keys,
        thread=_optional_str(data, "thread"),
        concurrency_key=_optional_str(data, "concurrency_key"),
        id=_optional_str(data, "id"),
        from_step=from_step,
    )
    return JsonResponse(run_json(run, viewer=user), status=201)


def start_as(user: Any, agent: str, payload: Any, **options: Any) -> Run:
    """``api.start_run`` for a web client, as ``user`` and in the policy's scope for them (keys and
    trigger ids sent over the web are the caller's own: another user can neither hold this caller's
    key nor claim a trigger id before their webhook sends it); each refusal as its ApiError."""
    try:
        run = api.start_run(agent, payload, created_by=user, scope=policy().scope(user), **options)
    except AgentNotFound as exc:
        raise ApiError(404, "agent_not_found", str(exc)) from None
    except (InvalidPayload, HistoryUnavailable) as exc:
        raise ApiError.of(exc) from None
    except ThreadForbidden as exc:
        raise ApiError(403, "thread_forbidden", str(exc)) from None
    if not policy().can_view(user, run):
        # A scope shared by several users (a site's policy), and the trigger id is already used by a
        # run of it this user may not see: do not reveal it.
        raise ApiError(409, "duplicate_id", f"the id is already used by another run of {agent}")
    return run


def _from_step(request: HttpRequest, value: Any) -> tuple[str, int] | None:
    """``[run_id, step]`` of a run the caller may view, or None."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
        or value[1] < -1
    ):
        raise ApiError(400, "invalid_field", "'from_step' must be [run id, step index], the index -1 or more")
    source = _run_for(request, value[0]) if isinstance(value[0], str) else None
    if source is None:
        raise ApiError(400, "invalid_field", "'from_step' must name a run id")
    return source.pk, value[1]


@api_view("GET")
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    """The run, its open wait point, the ids of the inputs it took, and one window of its steps
    (a run may have thousands): the latest ``STEPS_LIMIT`` by default.

    - ``?steps_after=<index>``: the first ``steps_limit`` steps with an index above it (forward:
      a client that has steps up to ``index`` asks for what came since).
    - ``?steps_before=<index>``: the last ``steps_limit`` steps with an index below it (backward,
      from the latest to index 0).
    - ``?steps_limit=<n>``: 1 to ``MAX_STEPS_LIMIT``, default ``STEPS_LIMIT``.

    ``steps_page`` says ``{limit, total, earlier, later}``: whether steps exist before the first
    and after the last step returned. Parameters are ASCII digits; anything else is a 400."""
    window = StepWindow(
        after=query_int(request, "steps_after"),
        before=query_int(request, "steps_before"),
        limit=query_int(request, "steps_limit", minimum=1, maximum=MAX_STEPS_LIMIT) or STEPS_LIMIT,
    )
    return JsonResponse(run_json(_run_for(request, run_id), viewer=request.api_user, window=window))  # type: ignore[attr-defined]


@api_view("POST")
def run_cancel(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _run_for(request, run_id, cancel=True)
    api.cancel_run(run.pk, by=request.api_user)  # type: ignore[attr-defined]
    run.refresh_from_db()
    status = 202 if run.status == "running" else 200
    return JsonResponse(run_json(run, viewer=request.api_user), status=status)  # type: ignore[attr-defined]


@api_view("POST")
def run_input(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _run_for(request, run_id, steer=True)
    data = _body(request)
    if "payload" not in data:
        raise ApiError(400, "invalid_field", "'payload' is required")
    try:
        item = api.send_input(run.pk, data["payload"])
    except (InvalidPayload, DecisionRefused, InputRefused) as exc:
        raise ApiError.of(exc) from None
    except RunNotFound:
        raise ApiError(404, "not_found", f"no run {run_id}") from None
    return JsonResponse({"id": item.pk, "run_id": run.pk}, status=202)


# The frames of a crash below are in error reports with their variables; a token there would let
# whoever reads the mail decide the approval.
@sensitive_variables("data", "token")
def _decide(request: HttpRequest, approval_id: str, approve: bool) -> HttpResponse:
    data = _body(request)
    token = data.get("token") or request.GET.get("token")
    user = request.api_user  # type: ignore[attr-defined]
    unknown = sorted(set(data) - {"reason", "token", *(["arguments"] if approve else [])})
    if unknown:
        raise ApiError(400, "invalid_field", f"unknown fields: {', '.join(unknown)}")
    waitpoint = decide(
        user if user.is_authenticated else None,
        approval_id,
        approve,
        reason=data.get("reason", ""),
        token=token,
        arguments=data.get("arguments"),
    )
    return JsonResponse(waitpoint_json(waitpoint) or {})


@sensitive_post_parameters("token")
@api_view("POST")
def approval_approve(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, True)


@sensitive_post_parameters("token")
@api_view("POST")
def approval_deny(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, False)


@sensitive_post_parameters("token")
@api_view("POST")
@sensitive_variables("data", "token")
def approval_answer(request: HttpRequest, approval_id: str) -> HttpResponse:
    """Answer a question: ``{"answer": <JSON>}`` (``null`` is an answer too, when its schema takes it)."""
    data = _body(request)
    unknown = sorted(set(data) - {"answer", "token"})
    if unknown:
        raise ApiError(400, "invalid_field", f"unknown fields: {', '.join(unknown)}")
    if "answer" not in data:
        raise ApiError(400, "invalid_field", "'answer' is required")
    token = data.get("token") or request.GET.get("token")
    user = request.api_user  # type: ignore[attr-defined]
    waitpoint = answer(user if user.is_authenticated else None, approval_id, data["answer"], token=token)
    return JsonResponse(waitpoint_json(waitpoint) or {})


def _again(request: HttpRequest, run_id: str, payload: Any = None, *, resend: bool = False) -> HttpResponse:
    user = _require_user(request)
    old = _run_for(request, run_id, steer=True)
    if not policy().can_start(user, old.agent):
        raise ApiError(403, "forbidden", f"you may not start {old.agent}")
    try:
        run = api.resend(old.pk, payload, by=user) if resend else api.regenerate(old.pk, by=user)
    except ThreadForbidden as exc:
        raise ApiError(403, "thread_forbidden", str(exc)) from None
    except ChamviError as exc:
        raise ApiError.of(exc) from None
    return JsonResponse(run_json(run, viewer=user), status=201)


@api_view("POST")
def run_regenerate(request: HttpRequest, run_id: str) -> HttpResponse:
    """Answer again (SPEC §12): a new run of the thread from the history this settled run started
    from, with its trigger. 201 with the new run; 409 ``run_active`` while this one is active."""
    data = _body(request)
    if data:
        raise ApiError(400, "invalid_field", f"unknown fields: {', '.join(sorted(data))}")
    return _again(request, run_id)


@api_view("POST")
def run_resend(request: HttpRequest, run_id: str) -> HttpResponse:
    """Edit an earlier message (SPEC §12): ``{"payload"}`` starts a new run of the thread from the
    history this settled run started from. 201 with the new run."""
    data = _body(request)
    unknown = sorted(set(data) - {"payload"})
    if unknown:
        raise ApiError(400, "invalid_field", f"unknown fields: {', '.join(unknown)}")
    if "payload" not in data:
        raise ApiError(400, "invalid_field", "'payload' is required")
    return _again(request, run_id, data["payload"], resend=True)


@api_view("GET")
def thread_detail(request: HttpRequest, thread: str) -> HttpResponse:
    """A thread and its current branch (SPEC §12): ``branch`` holds the runs the thread goes on
    from, oldest first (the latest ``THREAD_RUNS`` of them), ``replaced`` the ids of its other runs,
    which stay readable. ``?scope=`` names another scope than the caller's (``web.threads``)."""
    user = _require_user(request)
    found = threads.find(user, thread, request.GET.get("scope"))
    if found is None or not policy().can_view_thread(user, found):
        raise ApiError(404, "not_found", f"no thread {thread}")
    nodes = store.thread_nodes(found.name, found.scope)
    branch = current_branch(nodes)
    shown = branch[-THREAD_RUNS:]
    runs = {r.pk: r for r in Run.objects.filter(pk__in=shown)}
    on_branch = set(branch)
    return JsonResponse(
        {
            "thread": found.name,
            "scope": found.scope,
            "owner": found.owner_id,
            "branch": [branch_run_json(runs[i]) for i in shown if i in runs],
            "branch_page": {"total": len(branch), "earlier": len(branch) > len(shown)},
            "replaced": [n.id for n in nodes if n.id not in on_branch][-THREAD_RUNS:],
        }
    )
