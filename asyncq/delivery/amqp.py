"""Publishing to RabbitMQ where only a confirmed, routed publish counts as delivered.

Every message is persistent and published with ``mandatory`` on a channel with publisher confirms, so the
broker answers each one: ``basic.ack`` alone is the verified acknowledgement. The other answers map onto
:mod:`asyncq.errors`:

* no route (``basic.return`` before the ack, or an exchange that does not exist) → :class:`Unroutable`, a
  ``BadAck``: the broker accepted the bytes but no queue holds them, so the job is not delivered;
* ``basic.nack`` (e.g. a full queue with ``x-overflow=reject-publish``), a timeout, a lost connection →
  ``Retryable``; the channel is dropped and a new one is opened on the next call;
* a body that is not JSON → ``Permanent`` (from :func:`asyncq.delivery.base.encode_body`).

A timeout or a lost connection does not prove that the broker dropped the message: the retry may publish
it twice, which is why consumers deduplicate by ``message_id`` (see :mod:`asyncq.amqp`). A returned message
is matched to its publish by ``message_id`` (the job id), so two publishes of one id are never in flight
together on one channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, HeadersType

from asyncq.core.values import check_seconds
from asyncq.delivery.base import Body, encode_body
from asyncq.errors import BadAck, Retryable

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"

#: Called with each new channel before its first publish (e.g. to declare the queue being published to).
Declare = Callable[[AbstractChannel], Awaitable[object]]

# Failures of the connection or channel, where another attempt on a new channel may succeed.
_TRANSIENT = (
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.AMQPChannelError,
)


class Unroutable(BadAck):
    """The broker could not route the message to any queue: it is not delivered."""


class AmqpTransport:
    """Publishes each job as one persistent JSON message and returns only on a confirmed, routed publish.

    ``exchange`` ``""`` is the default exchange, where ``routing_key`` is a queue name. One connection
    and one confirm channel are opened on first use and shared by concurrent callers.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        routing_key: str,
        exchange: str = "",
        timeout: float = 10.0,
        declare: Declare | None = None,
    ) -> None:
        self.timeout = check_seconds(timeout, "timeout")
        self.url = url
        self.exchange = exchange
        self.routing_key = routing_key
        self._declare = declare
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._opening = asyncio.Lock()
        self._in_flight: dict[str, asyncio.Event] = {}

    async def deliver(self, job_id: str, body: Body, headers: Mapping[str, str]) -> None:
        """Publish ``body`` as JSON with ``message_id=job_id`` and ``headers``; return on the broker's ack."""
        await self.publish(job_id, encode_body(body), headers, content_type="application/json")

    async def publish(
        self,
        message_id: str,
        body: bytes,
        headers: Mapping[str, object],
        *,
        content_type: str | None = None,
        routing_key: str | None = None,
    ) -> None:
        """Publish raw ``body`` (e.g. a dead message being redriven); same answers as :meth:`deliver`."""
        if not isinstance(message_id, str) or not message_id:
            raise ValueError("message_id must be a non-empty str")
        message = aio_pika.Message(
            body,
            headers=cast(HeadersType, dict(headers)),
            message_id=message_id,
            content_type=content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        async with self._exclusive(message_id):
            await self._publish_confirmed(message, routing_key or self.routing_key)

    async def close(self) -> None:
        """Close the connection; the transport can be used again afterwards (it reconnects)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            await connection.close()

    async def __aenter__(self) -> AmqpTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _publish_confirmed(self, message: aio_pika.Message, routing_key: str) -> None:
        try:
            channel = await self._open_channel()
            exchange = await self._exchange(channel)
            await exchange.publish(message, routing_key, mandatory=True, timeout=self.timeout)
        except aiormq.exceptions.PublishError as exc:  # basic.return: confirmed, but routed nowhere
            raise Unroutable(f"no queue bound for {self.exchange!r}/{routing_key!r}: {exc}") from exc
        except aiormq.exceptions.DeliveryError as exc:  # basic.nack
            raise Retryable(f"broker refused the message: {exc}") from exc
        except aiormq.exceptions.ChannelNotFoundEntity as exc:  # the exchange does not exist
            await self._drop_channel()
            raise Unroutable(f"exchange {self.exchange!r} not found: {exc}") from exc
        except _TRANSIENT as exc:
            await self._drop_channel()
            raise Retryable(f"publish not confirmed: {type(exc).__name__}: {exc}") from exc

    async def _exchange(self, channel: AbstractChannel) -> aio_pika.abc.AbstractExchange:
        if self.exchange == "":
            return channel.default_exchange
        return await channel.get_exchange(self.exchange, ensure=False)

    async def _open_channel(self) -> AbstractChannel:
        async with self._opening:
            if self._channel is not None and not self._channel.is_closed:
                return self._channel
            if self._connection is None or self._connection.is_closed:
                self._connection = await aio_pika.connect(self.url, timeout=self.timeout)
            channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            if self._declare is not None:
                await self._declare(channel)
            self._channel = channel
            return channel

    async def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(Exception):  # already broken; the next call opens a new one
                await channel.close()

    def _exclusive(self, message_id: str) -> _OnePerId:
        return _OnePerId(self._in_flight, message_id)


class _OnePerId:
    """Waits until no other publish of the same message id is in flight on this transport."""

    def __init__(self, in_flight: dict[str, asyncio.Event], message_id: str) -> None:
        self._in_flight = in_flight
        self._id = message_id

    async def __aenter__(self) -> None:
        while (busy := self._in_flight.get(self._id)) is not None:
            await busy.wait()
        self._in_flight[self._id] = asyncio.Event()

    async def __aexit__(self, *exc_info: object) -> None:
        self._in_flight.pop(self._id).set()


class FakeAmqpTransport:
    """A transport for tests and examples that keeps what it was given instead of publishing.

    ``answers`` maps a job id to the exception its next deliveries raise (e.g. ``Unroutable``).
    """

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict[str, object]]] = []
        self.answers: dict[str, Exception] = {}
        self.closed = False

    async def deliver(self, job_id: str, body: Body, headers: Mapping[str, str]) -> None:
        """Record ``body`` as JSON, or raise the answer set for ``job_id``."""
        await self.publish(job_id, encode_body(body), headers)

    async def publish(
        self,
        message_id: str,
        body: bytes,
        headers: Mapping[str, object],
        *,
        content_type: str | None = None,
        routing_key: str | None = None,
    ) -> None:
        """Record a raw publish, or raise the answer set for ``message_id``."""
        answer = self.answers.get(message_id)
        if answer is not None:
            raise answer
        self.published.append((message_id, body, dict(headers)))

    async def close(self) -> None:
        """Mark the fake closed."""
        self.closed = True
