"""The JSON HTTP API (SPEC §7). Errors are ``{"error": {"code", "message"}}`` with a fitting 4xx."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import RawPostDataException
from django.views.decorators.csrf import csrf_exempt

from . import api
from .auth import AuthError, authenticate
from .conf import conf
from .errors import AgentNotFound, DecisionRefused, InvalidPayload, RunNotFound
from .models import Run, WaitPoint
from .policy import policy
from .serializers import run_json, waitpoint_json


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error(status: int, code: str, message: str) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="chamvi"'
    return response


def api_view(*methods: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt  # CSRF is enforced in authenticate() for session requests, not for bearer tokens.
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
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
            except (AuthError, ApiError) as exc:
                return error(exc.status, exc.code, exc.message)

        return wrapper

    return decorate


def _require_user(request: HttpRequest) -> Any:
    user = request.api_user  # type: ignore[attr-defined]
    if not user.is_authenticated:
        raise ApiError(401, "unauthenticated", "log in or send 'Authorization: Bearer <token>'")
    return user


def _body(request: HttpRequest) -> dict[str, Any]:
    # The payload cap plus room for the envelope's other fields.
    limit = int(conf.MAX_PAYLOAD_BYTES) + 16 * 1024
    declared = request.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "payload_too_large", "the request body is too large") from None
    except RawPostDataException:
        # A multipart form whose stream was already parsed (e.g. for its CSRF field): not JSON.
        raise ApiError(415, "unsupported_media_type", "send the body as application/json") from None
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


def _payload_error(exc: InvalidPayload) -> ApiError:
    if exc.too_large:
        return ApiError(413, "payload_too_large", str(exc))
    return ApiError(400, "invalid_payload", str(exc))


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value or len(value) > 200):
        raise ApiError(400, "invalid_field", f"'{key}' must be a non-empty string of at most 200 characters")
    return value


def _run_for(request: HttpRequest, run_id: str, *, steer: bool = False) -> Run:
    user = _require_user(request)
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not policy().can_view(user, run):
        raise ApiError(404, "not_found", f"no run {run_id}")
    if steer and not policy().can_steer(user, run):
        raise ApiError(403, "forbidden", "you may not steer this run")
    return run


@api_view("POST")
def runs(request: HttpRequest) -> HttpResponse:
    user = _require_user(request)
    data = _body(request)
    unknown = sorted(set(data) - {"agent", "payload", "thread", "concurrency_key", "keys", "id"})
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
    try:
        run = api.start_run(
            agent,
            data.get("payload"),
            source="http",
            trigger="http",
            keys=keys,
            thread=_optional_str(data, "thread"),
            concurrency_key=_optional_str(data, "concurrency_key"),
            created_by=user,
            id=_optional_str(data, "id"),
        )
    except AgentNotFound as exc:
        raise ApiError(404, "agent_not_found", str(exc)) from None
    except InvalidPayload as exc:
        raise _payload_error(exc) from None
    if not policy().can_view(user, run):
        # The trigger id is already used by a run this user may not see: do not reveal it.
        raise ApiError(409, "duplicate_id", f"the id is already used by another run of {agent}")
    return JsonResponse(run_json(run), status=201)


@api_view("GET")
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    return JsonResponse(run_json(_run_for(request, run_id)))


@api_view("POST")
def run_cancel(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _run_for(request, run_id, steer=True)
    api.cancel_run(run.pk)
    run.refresh_from_db()
    return JsonResponse(run_json(run), status=202 if run.status == "running" else 200)


@api_view("POST")
def run_input(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _run_for(request, run_id, steer=True)
    data = _body(request)
    if "payload" not in data:
        raise ApiError(400, "invalid_field", "'payload' is required")
    try:
        item = api.send_input(run.pk, data["payload"])
    except InvalidPayload as exc:
        raise _payload_error(exc) from None
    except DecisionRefused as exc:
        raise ApiError(409, exc.code, str(exc)) from None
    except RunNotFound:
        raise ApiError(404, "not_found", f"no run {run_id}") from None
    return JsonResponse({"id": item.pk, "run_id": run.pk}, status=202)


DECISION_STATUS = {"not_found": 404, "bad_token": 403, "already_decided": 409, "expired": 410}


def _decide(request: HttpRequest, approval_id: str, decision: str) -> HttpResponse:
    data = _body(request)
    token = data.get("token") or request.GET.get("token")
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        raise ApiError(400, "invalid_field", "'reason' must be a string")
    waitpoint = WaitPoint.objects.select_related("run").filter(approval_id=approval_id).first()
    if waitpoint is None:
        raise ApiError(404, "not_found", f"no approval {approval_id}")
    user = request.api_user  # type: ignore[attr-defined]
    if token is None:
        _require_user(request)
        if not policy().can_decide(user, waitpoint.run):
            raise ApiError(403, "forbidden", "you may not decide this approval")
    elif not isinstance(token, str):
        raise ApiError(400, "invalid_field", "'token' must be a string")
    decide = api.approve if decision == "approved" else api.deny
    try:
        waitpoint = decide(
            approval_id, by=user if user.is_authenticated else None, reason=reason, token=token
        )
    except DecisionRefused as exc:
        raise ApiError(DECISION_STATUS.get(exc.code, 409), exc.code, str(exc)) from None
    return JsonResponse(waitpoint_json(waitpoint) or {})


@api_view("POST")
def approval_approve(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, "approved")


@api_view("POST")
def approval_deny(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, "denied")
