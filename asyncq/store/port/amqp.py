"""The AMQP consumer's store port: what ``asyncq.amqp.IdempotentConsumer`` asks of a store, and the values that
cross it.

What every consumer store must guarantee (``process``):

- **Effect and key together.** A delivery's effect and its completion key commit in one write transaction, or
  neither does; the effect runs synchronously in it, in the store's connection thread, and is handed an
  ``EffectTransaction`` (``asyncq.store.port.effects``). A key that is already completed is a ``DUPLICATE``:
  the effect does not run again.
- **Counted before it runs again.** A redelivery (``redelivered``, or a quorum queue's ``delivery_count``) of an
  unfinished key is counted in a committed transaction of its own *before* its effect runs, so a message that
  crashes the process is still counted. Past ``delivery_limit`` deliveries, it is parked instead of run.
- **Parked whole.** A message past its limit, one whose effect raised ``Permanent``, or one without a key is
  parked (kept whole with its reason, ``PARKED``: acknowledged); a parked key that is redelivered is ``PARKED``
  again without running; a parked key published afresh runs, and leaves the dead list if it completes.
- **Errors noted.** Any other exception of the effect rolls it back, is noted with the key (the reason a later
  parking shows) and gives ``RETRY`` (requeued). A ``BaseException`` propagates after the rollback.
- **Time from the caller.** ``now_ms`` is the caller's clock.
- **Concurrency.** A store opened for ``connections`` concurrent calls serves that many ``process`` calls at
  once; more wait their turn.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from asyncq.store.port.effects import EffectTransaction


class DeliveryOutcome(enum.Enum):
    """What became of one delivery, and so what the broker is told (a job attempt's is ``core.lifecycle.Outcome``)."""

    COMPLETED = "completed"  # the effect and its key committed: ack
    DUPLICATE = "duplicate"  # the key was already completed: ack, the effect does not run again
    PARKED = "parked"  # parked as dead (delivery limit, Permanent, no key): ack
    RETRY = "retry"  # the effect failed: requeue (nack) for another delivery

    @property
    def acks(self) -> bool:
        """Whether the broker gets an ack (otherwise a requeueing nack)."""
        return self is not DeliveryOutcome.RETRY


@dataclass(frozen=True)
class Delivery:
    """One delivery as the effect sees it, independent of the AMQP client."""

    key: str | None
    body: bytes
    queue: str
    redelivered: bool = False
    delivery_count: int | None = None  # a quorum queue's x-delivery-count: earlier returns of this message
    headers: Mapping[str, object] = field(default_factory=dict)
    content_type: str | None = None

    def json(self) -> object:
        """The body decoded as UTF-8 JSON."""
        return json.loads(self.body.decode("utf-8"))

    def headers_text(self) -> str:
        """The headers as a parked message keeps them (JSON; a value JSON has no form for as its text)."""
        return json.dumps(dict(self.headers), default=str)


#: The database effect: runs inside the transaction that writes the completion key; raise to roll back.
Effect = Callable[[EffectTransaction, Delivery], object]


@dataclass(frozen=True)
class DeadMessage:
    """A parked message, with the reason it was parked."""

    seq: int
    key: str | None
    queue: str
    body: bytes
    headers: dict[str, object]
    content_type: str | None
    deliveries: int
    reason: str
    at_ms: int


class AmqpStore(Protocol):
    """The consumer's storage: completion keys, delivery counts and parked messages, beside the app's rows."""

    #: Where the store lives, for messages (a file path, or a URL without its password).
    location: str

    async def process(self, delivery: Delivery, effect: Effect, *, delivery_limit: int, now_ms: int) -> DeliveryOutcome:
        """Run ``effect`` for ``delivery`` at most once per key (see the module's rules); what to tell the broker."""
        ...

    async def dead_messages(self) -> list[DeadMessage]:
        """Every parked message, oldest first."""
        ...

    async def get_dead(self, seq: int) -> DeadMessage | None:
        """The parked message ``seq``, or ``None``."""
        ...

    async def forget_dead(self, seq: int) -> bool:
        """Remove parked message ``seq`` (after it was republished); ``False`` if it was not there."""
        ...

    async def close(self) -> None:
        """Close the store (after the calls in progress)."""
        ...
