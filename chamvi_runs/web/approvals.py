"""Deciding an approval, or answering a question, from the web: the JSON API, the pages, a websocket,
the admin. Each passes what its client sent and shows the ApiError it may get its own way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.views.decorators.debug import sensitive_variables

from .. import api
from ..core.storable import WHAT, unstorable
from ..errors import ChamviError
from ..models import Run, WaitPoint
from ..policy import can_answer, policy
from .errors import ApiError, unauthenticated


# The frames of a crash below (the store's included: the filter applies to callees) are in error
# reports with their variables; a token there would let whoever reads the mail decide the approval.
@sensitive_variables("token")
def decide(
    user: Any,
    approval_id: str,
    approve: bool,
    *,
    reason: object = "",
    token: object = None,
    arguments: object = None,
    visible: Callable[[Run], bool] | None = None,
    may_decide: Callable[[Any, Run], bool] | None = None,
) -> WaitPoint:
    """Approve or deny the approval ``approval_id`` as ``user``, and return the decided wait point.

    ``user`` None is a caller with no session and no API token: only the wait point's ``token``
    decides for it. Without a token, ``may_decide(user, run)`` (the policy's ``can_decide`` by
    default) must allow it. ``visible(run)`` false hides the approval (``not_found``), as for a
    socket the approval's run is not on. ``reason``, ``token`` and ``arguments`` (an approval's
    edited arguments) are as the client sent them.

    Raises ApiError: ``not_found``, ``unauthenticated``, ``forbidden``, ``invalid_field`` (a
    ``token`` that is not a string, a ``reason`` that is not a string or holds a NUL or a lone
    surrogate), or the
    refusal's (``bad_token``, ``already_decided``, ``expired``)."""
    token = _allowed(
        user, approval_id, token, visible, may_decide or policy().can_decide, "decide this approval"
    )
    if not isinstance(reason, str) or unstorable(reason):
        raise ApiError(400, "invalid_field", f"'reason' must be a string without {WHAT}")
    if arguments is not None and (not approve or not isinstance(arguments, dict)):
        raise ApiError(400, "invalid_field", "'arguments' must be an object, sent with approve")
    try:
        if approve:
            return api.approve(approval_id, by=user, reason=reason, token=token, arguments=arguments)
        return api.deny(approval_id, by=user, reason=reason, token=token)
    except ChamviError as exc:
        raise ApiError.of(exc) from None


@sensitive_variables("token")
def answer(
    user: Any,
    approval_id: str,
    value: object,
    *,
    token: object = None,
    visible: Callable[[Run], bool] | None = None,
) -> WaitPoint:
    """Answer the question ``approval_id`` as ``user`` (the run's creator by default:
    ``policy.can_answer``), or with its ``token``. Raises ApiError as ``decide`` does, and
    ``invalid_answer`` (400) for an answer its schema refuses, ``wrong_kind`` (409) for an approval."""
    token = _allowed(user, approval_id, token, visible, can_answer, "answer this question")
    try:
        return api.answer(approval_id, value, by=user, token=token)
    except ChamviError as exc:
        raise ApiError.of(exc) from None


def _allowed(
    user: Any,
    approval_id: str,
    token: object,
    visible: Callable[[Run], bool] | None,
    may: Callable[[Any, Run], bool],
    what: str,
) -> str | None:
    """The token, once the caller may act on the wait point: a user ``may`` act, or a token."""
    # PostgreSQL refuses a NUL or a lone surrogate in any text it is sent, a lookup's too: no approval
    # has one in its id.
    found = WaitPoint.objects.select_related("run").filter(approval_id=approval_id)
    waitpoint = None if unstorable(approval_id) else found.first()
    if waitpoint is None or (visible is not None and not visible(waitpoint.run)):
        raise ApiError(404, "not_found", f"no approval {approval_id}")
    if token is None:
        if user is None:
            raise unauthenticated()
        if not may(user, waitpoint.run):
            raise ApiError(403, "forbidden", f"you may not {what}")
        return None
    if not isinstance(token, str):
        raise ApiError(400, "invalid_field", "'token' must be a string")
    return token
