"""The AMQP consumer's rule for one delivery, as values: every consumer store (``asyncq.store.port.amqp`` states the
guarantees) asks these functions what to do and only runs its own statements.

A first delivery runs the effect at once. A redelivery (``redelivered``, or a quorum queue's ``delivery_count``) is
counted first (``deliveries_seen``); past the limit it is parked (``limit_reason``). An effect's error parks the
message if no retry can help (``parking_reason``, asyncq's one rule ``classify``), else it is noted
(``error_note``) and the message requeued.
"""

from __future__ import annotations

from asyncq.core.backoff import RetryPolicy
from asyncq.core.failures import classify
from asyncq.core.lifecycle import PERMANENT

#: Why a message without a key is parked (a completion key is what makes a redelivery safe).
NO_KEY = "no message id to use as completion key"

#: The consumer's retry is the broker's requeue, which has no delay: the policy only classifies.
REQUEUE = RetryPolicy(jitter=lambda: 0.0)

#: How much of an effect's error is kept with its key (the reason a later parking shows).
ERROR_NOTE_MAX_CHARS = 500


def deliveries_seen(redelivered: bool, delivery_count: int | None) -> int | None:
    """The least number of deliveries a redelivered message has had (to count before its effect runs again), or
    ``None`` for a first delivery (run at once, counted as 1)."""
    if not (redelivered or delivery_count):
        return None
    return (delivery_count or 0) + 1


def limit_reason(delivery_limit: int, deliveries: int, last_error: str | None) -> str | None:
    """Why a message delivered ``deliveries`` times is parked instead of run again, or ``None`` to run it."""
    if deliveries <= delivery_limit:
        return None
    seen = last_error or "none seen"
    return f"delivery limit {delivery_limit} exceeded ({deliveries} deliveries); last error: {seen}"


def parking_reason(error: Exception, deliveries: int) -> str | None:
    """Why a message whose effect raised ``error`` is parked (``Permanent``), or ``None`` to requeue it."""
    if classify(error, max(deliveries, 1), REQUEUE).outcome == PERMANENT:
        return f"permanent: {error}"
    return None


def error_note(error: Exception) -> str:
    """What is kept of an effect's error with its key until the next delivery."""
    return f"{type(error).__name__}: {error}"[:ERROR_NOTE_MAX_CHARS]
