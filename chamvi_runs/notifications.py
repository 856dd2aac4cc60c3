"""Telling people that a run waits for their decision: the agent's notifier."""

from __future__ import annotations

import logging

from . import store
from .agent import Agent
from .models import Run, WaitPoint

logger = logging.getLogger(__name__)


def notify(agent: Agent, run: Run, waitpoint: WaitPoint) -> bool:
    """Call the agent's notifier; ``notified_at`` is set once it returns. Raising = not notified yet."""
    if agent.notifier is None:
        return store.mark_notified(waitpoint)
    try:
        agent.notifier(run, waitpoint)
    except Exception:
        logger.warning("notifier of agent %s failed for %s", agent.name, waitpoint.approval_id, exc_info=True)
        return False
    return store.mark_notified(waitpoint)
