"""The idempotent RabbitMQ consumer: the effect and its completion key commit together, the ack comes after.

For each delivery the consumer runs the app's database effect and writes the message's completion key in
one transaction of its store, and acknowledges the delivery only once that transaction has committed:

* a crash before COMMIT leaves no effect and no key; the broker redelivers and the effect runs again;
* a crash after COMMIT but before the ack makes the broker redeliver a completed key: it is acknowledged
  without running the effect again (outcome ``DUPLICATE``);
* a message that keeps failing (or crashing the process) is bounded by its delivery count: the broker's
  ``x-delivery-count`` on a quorum queue, or a counted table otherwise. Past ``delivery_limit`` it is
  parked as dead with its reason (:func:`dead_messages`) and acknowledged; :func:`redrive` republishes it.

This makes a repeated delivery safe for the database effect only. It is not exactly-once delivery, and
external side effects (e-mail, payments) need their own design. The rule itself is the store's
(``asyncq.store.port.amqp`` states it, ``asyncq.core.redelivery`` decides; the drivers are
``asyncq.store.sqlite.amqp`` and, for a ``postgresql://`` URL, ``asyncq.store.postgres.amqp``); this module only
moves deliveries to it and answers the broker. The effect is ``effect(tx, delivery)``, with ``tx`` an
``EffectTransaction`` (``tx.execute(statement, parameters)``), run in the store's connection thread.

    async with IdempotentConsumer("app.db", issue_ticket, queue="registrations", concurrency=4) as consumer:
        await consumer.run()  # until consumer.stop() (e.g. from a SIGTERM handler)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue

from asyncq.core.clock import wall_clock_ms
from asyncq.core.values import check_int, check_time
from asyncq.delivery.amqp import DEFAULT_URL, AmqpTransport
from asyncq.store.opening import open_amqp_store, read_dead_messages
from asyncq.store.port.amqp import AmqpStore, DeadMessage, Delivery, DeliveryOutcome, Effect

log = logging.getLogger(__name__)

# Headers the broker adds about earlier deliveries; a redriven message starts afresh without them.
_BROKER_HEADERS = ("x-delivery-count", "x-death", "x-first-death-exchange", "x-first-death-queue")


@dataclass
class ConsumerStats:
    """Counts since :meth:`IdempotentConsumer.start` (in memory: a killed process loses them)."""

    delivered: int = 0
    redelivered: int = 0
    completed: int = 0
    duplicates: int = 0
    parked: int = 0
    requeued: int = 0


class IdempotentConsumer:
    """Consumes ``queue`` with at most ``prefetch`` unacknowledged deliveries and ``concurrency`` deliveries
    in progress at once, each on its own connection of the store ``database`` names (a SQLite file, or a
    ``postgresql://`` URL), each effect in a thread of its own. SQLite runs one write transaction at a time, so
    there concurrency overlaps one delivery's effect with the others' commits, acks and waits, not two effects
    with each other; on PostgreSQL effects on different keys run at once.

    ``queue_arguments`` declares the queue (durable) with those arguments, e.g. ``{"x-queue-type":
    "quorum"}``; ``declare=False`` uses an existing queue. ``key`` derives the completion key from a
    delivery (default: its ``message_id``). ``on_outcome`` is called in the event loop after each answer.
    """

    def __init__(
        self,
        database: object,
        effect: Effect,
        *,
        queue: str,
        url: str = DEFAULT_URL,
        prefetch: int = 10,
        concurrency: int = 1,
        delivery_limit: int = 5,
        queue_arguments: Mapping[str, Any] | None = None,
        declare: bool = True,
        key: Callable[[AbstractIncomingMessage], str | None] | None = None,
        on_outcome: Callable[[Delivery, DeliveryOutcome], object] | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.prefetch = check_int(prefetch, "prefetch", 1, 65_535)  # AMQP's prefetch count is 16 bits
        self.concurrency = check_int(concurrency, "concurrency", 1, 1000)
        self.delivery_limit = check_int(delivery_limit, "delivery_limit", 1, 1000)
        self.database = database
        self.effect = effect
        self.queue_name = queue
        self.url = url
        self.queue_arguments = dict(queue_arguments or {})
        self.declare = declare
        self.stats = ConsumerStats()
        #: Set once the broker has confirmed ``basic.consume``.
        self.consuming = asyncio.Event()
        self._key = key or _message_id
        self._on_outcome = on_outcome
        self._clock = clock
        self._store: AmqpStore | None = None
        self._slots = asyncio.Semaphore(self.concurrency)
        self._connection: AbstractConnection | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._handling: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._done = asyncio.Event()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` has begun: no new effect starts."""
        return self._stopping

    async def __aenter__(self) -> IdempotentConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the store (``concurrency`` connections) and the broker connection, then start consuming; on
        failure everything opened so far is closed again."""
        try:
            self._store = await open_amqp_store(self.database, connections=self.concurrency)
            self._connection = await aio_pika.connect(self.url)
            self._connection.close_callbacks.add(self._on_connection_closed)
            self._queue = await self._open_queue(self._connection)
            self._tag = await self._queue.consume(self._on_message)
        except BaseException:
            await self.stop()
            raise
        self.consuming.set()
        log.debug("consuming %s (prefetch=%d, concurrency=%d)", self.queue_name, self.prefetch, self.concurrency)

    async def _open_queue(self, connection: AbstractConnection) -> AbstractQueue:
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=self.prefetch)
        if not self.declare:
            return await channel.get_queue(self.queue_name, ensure=True)
        return await channel.declare_queue(self.queue_name, durable=True, arguments=self.queue_arguments)

    async def run(self) -> None:
        """Wait until :meth:`stop` is called; raise ``ConnectionError`` if the broker connection is lost."""
        await self._done.wait()
        if not self._stopping:
            await self.stop()
            raise ConnectionError(f"connection to RabbitMQ lost while consuming {self.queue_name!r}")

    async def stop(self, timeout: float | None = 30.0) -> None:
        """Stop taking deliveries, let running effects finish and be acknowledged (up to ``timeout``
        seconds), then close: deliveries not yet started return to the queue. :meth:`run` returns once all
        is closed, the store included."""
        self._stopping = True
        try:
            await self._cancel_consumer()
            if self._handling:
                await asyncio.wait(set(self._handling), timeout=timeout)
            connection, self._connection = self._connection, None
            if connection is not None and not connection.is_closed:
                await connection.close()
        finally:
            store, self._store = self._store, None
            try:
                if store is not None:
                    await store.close()
            finally:
                self._done.set()

    async def _cancel_consumer(self) -> None:
        queue, tag, self._tag = self._queue, self._tag, None
        if queue is None or tag is None or self._connection is None or self._connection.is_closed:
            return
        try:
            await queue.cancel(tag)
        except Exception as exc:  # the channel is gone: nothing more will be delivered anyway
            log.debug("basic.cancel failed: %r", exc)

    def _on_connection_closed(self, *args: object) -> None:
        if not self._stopping:  # a stop closes the connection itself, and ``run`` waits for the stop to end
            self._done.set()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handling.add(task)
        try:
            await self._handle(message)
        finally:
            self._handling.discard(task)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        delivery = self._delivery(message)
        self.stats.delivered += 1
        self.stats.redelivered += delivery.redelivered
        async with self._slots:
            try:
                if self._stopping or self._store is None:
                    outcome = DeliveryOutcome.RETRY  # not started: back to the queue for the next consumer
                else:
                    now_ms = check_time(self._clock(), "clock()")
                    outcome = await self._store.process(
                        delivery, self.effect, delivery_limit=self.delivery_limit, now_ms=now_ms
                    )
            except Exception:
                log.exception("delivery %r could not be processed; requeueing it", delivery.key)
                outcome = DeliveryOutcome.RETRY
        await self._answer(message, delivery, outcome)

    async def _answer(self, message: AbstractIncomingMessage, delivery: Delivery, outcome: DeliveryOutcome) -> None:
        try:
            if outcome.acks:
                await message.ack()
            else:
                await message.nack(requeue=True)
        except Exception as exc:  # committed work stays committed; the redelivery will be a DUPLICATE
            log.warning("could not answer delivery %r (%s): %r", delivery.key, outcome.value, exc)
            return
        self._count(outcome)
        if self._on_outcome is not None:
            self._on_outcome(delivery, outcome)

    def _count(self, outcome: DeliveryOutcome) -> None:
        name = {
            DeliveryOutcome.COMPLETED: "completed",
            DeliveryOutcome.DUPLICATE: "duplicates",
            DeliveryOutcome.PARKED: "parked",
            DeliveryOutcome.RETRY: "requeued",
        }[outcome]
        setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _delivery(self, message: AbstractIncomingMessage) -> Delivery:
        headers = dict(message.headers or {})
        count = headers.get("x-delivery-count")
        return Delivery(
            key=self._key(message),
            body=message.body,
            queue=self.queue_name,
            redelivered=bool(message.redelivered),
            delivery_count=count if isinstance(count, int) else None,
            headers=headers,
            content_type=message.content_type,
        )


def _message_id(message: AbstractIncomingMessage) -> str | None:
    return message.message_id or None


def dead_messages(database: object) -> list[DeadMessage]:
    """The messages parked in ``database``, oldest first, each with its reason (read synchronously)."""
    return read_dead_messages(database)


async def redrive(database: object, seq: int, transport: AmqpTransport) -> DeadMessage:
    """Republish parked message ``seq`` to its queue (confirmed and routed), then forget it.

    The broker's delivery headers are dropped, so the message starts with a fresh delivery count. A crash
    between the publish and the forget leaves the row to be redriven again: the key makes that harmless.
    """
    store = await open_amqp_store(database, connections=1)
    try:
        dead = await store.get_dead(seq)
        if dead is None:
            raise LookupError(f"no parked message {seq}")
        if dead.key is None:
            raise ValueError(f"parked message {seq} has no message id; republishing it unchanged cannot help")
        headers = {name: value for name, value in dead.headers.items() if name not in _BROKER_HEADERS}
        await transport.publish(dead.key, dead.body, headers, content_type=dead.content_type, routing_key=dead.queue)
        await store.forget_dead(seq)
        return dead
    finally:
        await store.close()
