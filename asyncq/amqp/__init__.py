"""An idempotent RabbitMQ consumer: the completion key commits with the effect, the ack follows the commit.

``asyncq.amqp.consumer`` holds the consumer, over the consumer store's port (``asyncq.store.port.amqp``; the
drivers are ``asyncq.store.sqlite.amqp`` and, for a ``postgresql://`` URL, ``asyncq.store.postgres.amqp``). An
effect is written against ``EffectTransaction``; SQLite's ``process_delivery`` is in ``asyncq.sqlite``.
"""

from asyncq.amqp.consumer import IdempotentConsumer, dead_messages, redrive
from asyncq.store.port.amqp import DeadMessage, Delivery, DeliveryOutcome, Effect
from asyncq.store.port.effects import EffectTransaction

__all__ = [
    "DeadMessage",
    "Delivery",
    "DeliveryOutcome",
    "Effect",
    "EffectTransaction",
    "IdempotentConsumer",
    "dead_messages",
    "redrive",
]
