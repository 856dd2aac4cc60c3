"""Authentication for the HTTP API: the Django session (CSRF enforced), or ``Authorization: Bearer``
with an ApiToken (stored hashed; the raw token is shown once when a staff user creates it). A
websocket takes the same token as a subprotocol (``socket_auth.py``)."""

from __future__ import annotations

import secrets
from typing import Any

from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from ..models import ApiToken
from ..store import hash_token
from .errors import ApiError

TOKEN_PREFIX = "chv_"


@sensitive_variables("raw")
def create_token(user: Any, name: str) -> tuple[ApiToken, str]:
    """Create an API token for ``user``; returns the row and the raw token (not stored)."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, prefix=raw[:10], token_hash=hash_token(raw))
    return token, raw


def _csrf_failure(request: HttpRequest) -> str | None:
    middleware = CsrfViewMiddleware(lambda req: None)  # type: ignore[arg-type]
    middleware.process_request(request)
    response = middleware.process_view(request, lambda req: None, (), {})  # type: ignore[arg-type,return-value]
    return None if response is None else "CSRF verification failed"


# A crash in here (or below: the filter applies to callees) puts the frames' variables in the error
# report; the raw bearer token must not be among them.
@sensitive_variables("raw")
def token_user(raw: str) -> tuple[int, Any] | None:
    """The API token ``raw`` and its user, as (the token's pk, the user), or None: no such token, or
    its user is not active. Records that the token was used."""
    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw.strip())).first()
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.pk, token.user


@sensitive_variables("header", "raw")
def authenticate(request: HttpRequest) -> Any:
    """The request's user, from a bearer token or the session. Raises ApiError (401/403)."""
    header = request.headers.get("Authorization", "").strip()
    scheme, _, raw = header.partition(" ")
    # Other schemes (e.g. HTTP basic auth of a proxy in front of the site) leave the session in charge.
    if scheme.lower() == "bearer":
        if not raw.strip():
            raise ApiError(401, "unauthenticated", "use 'Authorization: Bearer <token>'")
        found = token_user(raw)
        if found is None:
            raise ApiError(401, "unauthenticated", "invalid API token")
        return found[1]
    user = request.user
    if not user.is_authenticated:
        return user
    if request.method not in ("GET", "HEAD", "OPTIONS") and _csrf_failure(request):
        raise ApiError(
            403, "csrf_failed", "CSRF verification failed: send the csrftoken cookie and X-CSRFToken"
        )
    return user
