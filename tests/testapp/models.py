from django.db import models


class Refund(models.Model):
    """Written by the effect tool inside the transaction that records it."""

    order_id = models.CharField(max_length=50)
    amount_cents = models.IntegerField()
    idempotency_key = models.CharField(max_length=300)

    def __str__(self) -> str:
        return f"refund {self.order_id}"
