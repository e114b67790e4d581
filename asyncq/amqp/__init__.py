"""An idempotent RabbitMQ consumer: the completion key commits with the effect, the ack follows the commit."""

from asyncq.amqp.consumer import (
    DeadMessage,
    Delivery,
    Effect,
    IdempotentConsumer,
    Outcome,
    dead_messages,
    process_delivery,
    redrive,
)

__all__ = [
    "DeadMessage",
    "Delivery",
    "Effect",
    "IdempotentConsumer",
    "Outcome",
    "dead_messages",
    "process_delivery",
    "redrive",
]
