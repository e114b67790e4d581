"""An idempotent RabbitMQ consumer: the completion key commits with the effect, the ack follows the commit.

``asyncq.amqp.consumer`` holds the consumer, over the consumer store's port (``asyncq.store.port.amqp``; the
SQLite driver is ``asyncq.store.sqlite.amqp``). An effect is written against ``EffectTransaction``.
"""

from asyncq.amqp.consumer import IdempotentConsumer, dead_messages, redrive
from asyncq.store.port.amqp import DeadMessage, Delivery, Effect, Outcome
from asyncq.store.port.effects import EffectTransaction

__all__ = [
    "DeadMessage",
    "Delivery",
    "Effect",
    "EffectTransaction",
    "IdempotentConsumer",
    "Outcome",
    "dead_messages",
    "redrive",
]
