"""A websocket's handshake (``routing.guarded``) and who its user is now (SPEC §8, extended).

A socket is authenticated one of two ways:

- By an API token (the HTTP API's, ``auth.py``), offered as the subprotocol
  ``chamvi.bearer.<token>`` beside ``chamvi``, which the server echoes: never in the URL, which
  access logs keep. A token is not ambient authority (another site's page cannot know it, while it
  can make a browser send its cookies), so such a socket needs no Origin, and scripts send none;
  its cookies are ignored. A token that does not authenticate gets close code 4401 once accepted.
- Otherwise by the Django session of its cookie, and then its Origin must be the site's own, as
  Django's CSRF check wants of a POST: the origin of the request itself (its ``Host``, which must
  be one of ``ALLOWED_HOSTS``, as ``request.get_host()`` checks, and its scheme, the scope's or
  ``SECURE_PROXY_SSL_HEADER``'s), or one of ``CSRF_TRUSTED_ORIGINS`` (patterns such as
  ``https://*.example.com`` included). Another site's Origin, or none, is refused at the handshake
  (HTTP 403), whatever ``ALLOWED_HOSTS`` allows (``["*"]`` included). daphne does not tell a
  websocket's scheme, so ``https://<host>`` is taken too: a secure page is no downgrade attacker.

A socket lives for hours: ``current_user`` says who its user is now, from the session store or the
token table and a fresh user row (a site whose own middleware signs sockets in, without a session:
the user's row). The consumers ask it on every command and now and then.
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain

from ..models import ApiToken
from .auth import token_user

SUBPROTOCOL = "chamvi"
BEARER = "chamvi.bearer."
# In the scope of a socket that offered a token: the ApiToken's pk, or None for a refused token.
TOKEN = "chamvi_token"


class SocketGuard:
    """ASGI middleware in front of websocket routes: a token socket gets its user in the scope; any
    other goes through Channels' session and auth middleware once its Origin passed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.with_session: Any = AuthMiddlewareStack(inner)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        offered = scope.get("subprotocols") or []
        bearer = next((p for p in offered if p.startswith(BEARER)), None)
        if bearer is None:
            if not origin_allowed(scope):
                return await _refuse(scope, receive, send)
            return await self.with_session(scope, receive, send)
        if SUBPROTOCOL not in offered:
            # The server echoes "chamvi", never the token: a client that did not offer it would fail.
            return await _refuse(scope, receive, send)
        found = await database_sync_to_async(token_user)(bearer[len(BEARER) :])
        user = found[1] if found else AnonymousUser()
        return await self.inner({**scope, "user": user, TOKEN: found[0] if found else None}, receive, send)


async def _refuse(scope: Any, receive: Any, send: Any) -> Any:
    """Closes the handshake: the client gets HTTP 403."""
    denier: Any = WebsocketDenier()
    return await denier(scope, receive, send)


def subprotocol(scope: Any) -> str | None:
    """The subprotocol to accept the socket with: ``chamvi`` when the client offered it."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or []) else None


def refused_token(scope: Any) -> bool:
    return TOKEN in scope and scope[TOKEN] is None


class _Handshake(HttpRequest):
    """The handshake as Django's request, for ``get_host()`` (``ALLOWED_HOSTS``,
    ``USE_X_FORWARDED_HOST``) and ``scheme`` (``SECURE_PROXY_SSL_HEADER``)."""

    def __init__(self, scope: Any, headers: dict[str, str]) -> None:
        super().__init__()
        self.META = {"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}
        server = scope.get("server") or ("", "")
        self.META["SERVER_NAME"], self.META["SERVER_PORT"] = str(server[0] or ""), str(server[1] or "")
        self.secure_scope = scope.get("scheme") in ("wss", "https")

    def _get_scheme(self) -> str:
        return "https" if self.secure_scope else "http"


def origin_allowed(scope: Any) -> bool:
    """Whether the handshake's Origin is the site's own, by the rules of Django's CSRF check."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
    origin = headers.get("origin")
    if not origin:
        return False
    request = _Handshake(scope, headers)
    try:
        host = request.get_host()
    except DisallowedHost:
        pass
    else:
        if origin in (f"{request.scheme}://{host}", f"https://{host}"):
            return True
    trusted = settings.CSRF_TRUSTED_ORIGINS
    if origin in [t for t in trusted if "*" not in t]:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    patterns = [urlsplit(t) for t in trusted if "*" in t]
    return any(
        p.scheme == parsed.scheme and is_same_domain(parsed.netloc, p.netloc.lstrip("*")) for p in patterns
    )


class _Snapshot(dict[str, Any]):
    """A session's data for ``auth.get_user``, which flushes a session whose hash no longer matches
    and cycles the key of one a fallback secret verified. A socket cannot send the browser a new
    cookie: the stored session is left for the browser's next HTTP request to settle."""

    def flush(self) -> None:
        self.clear()

    def cycle_key(self) -> None:
        pass


def current_user(scope: Any) -> Any:
    """The socket's user as the database says now: AnonymousUser once its credentials no longer
    authenticate (its session logged out, flushed or expired, its password changed, its user
    deactivated; its token deleted). Django's own rules, so custom user models and backends hold."""
    if TOKEN in scope:
        token = ApiToken.objects.select_related("user").filter(pk=scope[TOKEN]).first()
        return token.user if token is not None and token.user.is_active else AnonymousUser()
    session = scope.get("session")
    if session is None:
        # A site's own middleware signed it in (no session, no token here): its user's row, as it is now.
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            return AnonymousUser()
        fresh = get_user_model()._default_manager.filter(pk=user.pk).first()
        return fresh if fresh is not None and fresh.is_active else AnonymousUser()
    key = session.session_key
    if not key:
        return AnonymousUser()
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    return auth.get_user(SimpleNamespace(session=_Snapshot(store.items())))  # type: ignore[arg-type]
