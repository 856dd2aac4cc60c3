"""Telling people that a run waits for their decision: the agent's notifier.

One notifier call at a time per wait point, whoever makes it (the execution that opened it, or any
janitor): the call is taken with a conditional write first (``store.take_notification``), so a
re-send never races a call still in flight, and a failed call backs off before the next try.
"""

from __future__ import annotations

import logging

from .. import store
from ..agents.agent import Agent
from ..models import Run, WaitPoint

logger = logging.getLogger(__name__)


def notify(agent: Agent, run: Run, waitpoint: WaitPoint, *, resend: bool = False) -> bool:
    """Call the agent's notifier; ``notified_at`` is set once it returns. Raising = not notified yet.
    ``resend`` mints a new token first (only the latest is valid). False: not notified now (failed,
    or another process is calling, or the wait point is backing off)."""
    if agent.notifier is None:
        return store.mark_notified(waitpoint)
    if not store.take_notification(waitpoint):
        return False
    if resend or waitpoint.token is None:
        token = store.reissue_token(waitpoint)
        if token is None:
            return False  # decided meanwhile: nobody needs telling
        waitpoint.token = token
    try:
        agent.notifier(run, waitpoint)
    except Exception:
        logger.warning("notifier of agent %s failed for %s", agent.name, waitpoint.approval_id, exc_info=True)
        store.notification_failed(waitpoint)
        return False
    return store.mark_notified(waitpoint)
