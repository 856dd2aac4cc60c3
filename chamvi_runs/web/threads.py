"""Which thread a page or a socket means by a name.

Threads are named within a scope (``models.Thread``): over HTTP a user's thread names are in the
policy's scope for that user, from Python in the empty scope unless the site passes one. A page or
a socket that names a thread gets ``?scope=`` when it names another scope (the run page links a
run's thread with it); without it the name is looked up in the caller's own scope, then in the
empty scope, so a user's thread page and socket find both the threads they started over HTTP and
those the site started for them in code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from ..core.storable import unstorable
from ..models import Thread
from ..policy import policy


def scopes_of(user: Any, scope: str | None) -> list[str]:
    """The scopes a name is looked up in, in order: ``scope`` alone when it is given."""
    if scope is not None:
        return [scope]
    own = policy().scope(user) if user.is_authenticated else ""
    return list(dict.fromkeys([own, ""]))


def find(user: Any, name: str, scope: str | None = None) -> Thread | None:
    """The thread ``name`` means for ``user`` (not yet asked whether they may view it), or None."""
    if unstorable(name) or (scope is not None and unstorable(scope)):
        return None
    for each in scopes_of(user, scope):
        thread = Thread.objects.filter(scope=each, name=name).first()
        if thread is not None:
            return thread
    return None


def query_of(thread: Thread, user: Any) -> str:
    """The query a link to ``thread`` needs for ``user``: none when its name alone finds it."""
    return "" if find(user, thread.name) == thread else "?" + urlencode({"scope": thread.scope})
