"""What a client may send over a websocket (SPEC §8: ``input``, ``cancel``, ``approve``, ``deny``; §12:
``answer``, ``approve`` with edited ``arguments``, ``regenerate``, ``resend``) and
the answer each gets: an ``ack``, or an ``error`` with a stable code. Each is checked against the
same policy as the HTTP API, for the user as the database says now (the consumer looks them up
again for every command: ``socket_auth.current_user``). A malformed message (not JSON, not an
object, nested deeper than ``MAX_DEPTH``) is an error reply, never a disconnect; so is a command
that fails unexpectedly (its cause is logged for the site).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeGuard

from .. import api
from ..core.storable import unstorable
from ..errors import ChamviError
from ..models import Run
from ..policy import policy
from .approvals import answer as answer_question
from .approvals import decide
from .errors import ApiError

logger = logging.getLogger(__name__)

COMMANDS = ("input", "cancel", "approve", "deny", "answer", "regenerate", "resend")
MAX_DEPTH = 64
P = ParamSpec("P")


def error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


def malformed(content: Any) -> dict[str, Any] | None:
    """The error reply to a decoded message that no command can be read from, or None."""
    if not isinstance(content, dict):
        return error("invalid_message", "send a JSON object")
    if _deeper_than(content, MAX_DEPTH):
        return error("invalid_message", f"nest the message at most {MAX_DEPTH} deep")
    return None


def _replied(apply: Callable[P, dict[str, Any]]) -> Callable[P, dict[str, Any]]:
    """``apply``, with its refusals and failures turned into error replies: a client message never
    ends the socket, and an unexpected failure is logged for the site."""

    @functools.wraps(apply)
    def replied(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        try:
            return apply(*args, **kwargs)
        except ChamviError as exc:
            return _refused(ApiError.of(exc))
        except ApiError as exc:
            return _refused(exc)
        except Exception:
            logger.exception("websocket command failed")
            return error("internal_error", "the command failed")

    return replied


@_replied
def answer(
    user: Any,
    content: dict[str, Any],
    target: Callable[[dict[str, Any]], Run | None],
    shows: Callable[[Run], bool],
) -> dict[str, Any]:
    """The reply to ``content`` from ``user``. ``target`` finds the run a steering message is for
    among the socket's runs (None: not one of them); ``shows`` says whether the socket shows a run
    to its user (a decision is only taken for an approval of such a run)."""
    kind = content.get("type")
    if kind not in COMMANDS:
        return error("invalid_message", f"unknown type {kind!r}; one of {', '.join(COMMANDS)}")
    if kind in ("approve", "deny", "answer"):
        approval_id = content.get("approval_id")
        if not is_id(approval_id):
            return error("invalid_message", f"{kind} needs an approval_id")
        # The decision is checked against the run the approval belongs to, which must be one of
        # this socket's runs.
        if kind == "answer":
            if "answer" not in content:
                return error("invalid_message", "answer needs an answer")
            waitpoint = answer_question(user, approval_id, content["answer"], visible=shows)
        else:
            reason = str(content.get("reason") or "")
            waitpoint = decide(
                user,
                approval_id,
                kind == "approve",
                reason=reason,
                arguments=content.get("arguments"),
                visible=shows,
            )
        return {"type": "ack", "action": kind, "approval_id": waitpoint.approval_id}
    run = target(content)
    if run is None or not policy().can_view(user, run):
        return error("not_found", "no such run")
    if kind == "cancel":
        if not policy().can_cancel(user, run):
            return error("forbidden", "you may not cancel this run")
        return {"type": "ack", "action": "cancel", "status": api.cancel_run(run.pk, by=user)}
    if kind in ("regenerate", "resend"):
        return _again(user, run, content, kind)
    if not policy().can_steer(user, run):
        return error("forbidden", "you may not steer this run")
    item = api.send_input(run.pk, content.get("payload"))
    return {"type": "ack", "action": "input", "input_id": item.pk}


def _again(user: Any, run: Run, content: dict[str, Any], kind: str) -> dict[str, Any]:
    """Regenerate or resend ``run`` (SPEC §12): the ack names the new run, which a thread socket
    streams next (a run socket follows its own run only)."""
    if not (policy().can_steer(user, run) and policy().can_start(user, run.agent)):
        return error("forbidden", f"you may not {kind} this run")
    if kind == "resend":
        if "payload" not in content:
            return error("invalid_message", "resend needs a payload")
        new = api.resend(run.pk, content["payload"], by=user)
    else:
        new = api.regenerate(run.pk, by=user)
    return {"type": "ack", "action": kind, "run_id": new.pk, "replaces": run.pk}


def _refused(exc: ApiError) -> dict[str, Any]:
    # A field of a message that is not what the command takes is a malformed message, as a
    # message that is not JSON.
    return error("invalid_message" if exc.code == "invalid_field" else exc.code, exc.message)


def is_id(value: object) -> TypeGuard[str]:
    """A run or approval id as a client may send it: PostgreSQL refuses NUL characters and
    lone surrogates in queries."""
    return isinstance(value, str) and 0 < len(value) <= 200 and not unstorable(value)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects nest deeper than ``limit`` (iteratively: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
