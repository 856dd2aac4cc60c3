"""Who calls an agent's notifier for a wait point, and when: one call at a time, backing off."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.db.models import F, Q
from django.db.models.functions import Now

from ..core.records import hash_token
from ..models import WaitPoint
from .fence import db_now_plus

# A notifier call in flight holds the wait point this long: no one re-sends meanwhile.
NOTIFY_LEASE = timedelta(minutes=5)


def notify_backoff(attempts: int) -> timedelta:
    """Wait before re-sending after ``attempts`` failed notifier calls: 30 s, doubling, at most 1 h."""
    # int ** int is Any to mypy (a negative exponent gives a float); this one never is negative.
    doublings: int = 2 ** max(attempts - 1, 0)
    return min(timedelta(seconds=30) * doublings, timedelta(hours=1))


def take_notification(waitpoint: WaitPoint) -> bool:
    """Take the right to call the notifier now: the wait point is open, not notified, and no other
    call is in flight or backing off. Two janitors (or an execution and a janitor) never both get
    it. False: leave it alone."""
    due = Q(next_notify_at__isnull=True) | Q(next_notify_at__lte=Now())
    open_ = Q(pk=waitpoint.pk, decision__isnull=True, notified_at__isnull=True)
    return bool(
        WaitPoint.objects.filter(due, open_).update(
            next_notify_at=db_now_plus(NOTIFY_LEASE), notify_attempts=F("notify_attempts") + 1
        )
    )


def notification_failed(waitpoint: WaitPoint) -> bool:
    """Back off before the next try. False: notified meanwhile, nothing to back off."""
    attempts = WaitPoint.objects.filter(pk=waitpoint.pk).values_list("notify_attempts", flat=True).first()
    return bool(
        WaitPoint.objects.filter(pk=waitpoint.pk, notified_at__isnull=True).update(
            next_notify_at=db_now_plus(notify_backoff(attempts or 1))
        )
    )


def mark_notified(waitpoint: WaitPoint) -> bool:
    """False: already marked notified (by another process)."""
    return bool(
        WaitPoint.objects.filter(pk=waitpoint.pk, notified_at__isnull=True).update(
            notified_at=Now(), next_notify_at=None
        )
    )


def reissue_token(waitpoint: WaitPoint) -> str | None:
    """Mint a new token for a re-sent notification; only the latest is valid. None: the wait point
    was decided meanwhile, and no token decides it any more."""
    token = secrets.token_urlsafe(32)
    updated = WaitPoint.objects.filter(pk=waitpoint.pk, decision__isnull=True).update(
        token_hash=hash_token(token)
    )
    return token if updated else None
