"""Authentication for the HTTP API: the Django session (CSRF enforced), or ``Authorization: Bearer``
with an ApiToken (stored hashed; the raw token is shown once when a staff user creates it)."""

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
@sensitive_variables("header", "raw", "token")
def authenticate(request: HttpRequest) -> Any:
    """The request's user, from a bearer token or the session. Raises ApiError (401/403)."""
    header = request.headers.get("Authorization", "").strip()
    scheme, _, raw = header.partition(" ")
    # Other schemes (e.g. HTTP basic auth of a proxy in front of the site) leave the session in charge.
    if scheme.lower() == "bearer":
        if not raw.strip():
            raise ApiError(401, "unauthenticated", "use 'Authorization: Bearer <token>'")
        token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw.strip())).first()
        if token is None or not token.user.is_active:
            raise ApiError(401, "unauthenticated", "invalid API token")
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token.user
    user = request.user
    if not user.is_authenticated:
        return user
    if request.method not in ("GET", "HEAD", "OPTIONS") and _csrf_failure(request):
        raise ApiError(
            403, "csrf_failed", "CSRF verification failed: send the csrftoken cookie and X-CSRFToken"
        )
    return user
