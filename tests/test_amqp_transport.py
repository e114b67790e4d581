"""``asyncq.delivery.amqp`` against the real broker: only a confirmed, routed publish returns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from rabbit_support import QUEUE_ARGUMENTS, amqp_url, unique_queue

from asyncq.delivery.amqp import AmqpTransport, FakeAmqpTransport, Unroutable
from asyncq.errors import BadAck, Permanent, Retryable

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(30)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractConnection]:
    async with await aio_pika.connect(amqp_url) as connection:
        yield connection


@pytest.fixture
async def channel(connection: AbstractConnection) -> AbstractChannel:
    return await connection.channel()


async def test_a_routed_publish_is_persistent_json_with_its_id_and_headers(
    amqp_url: str, channel: AbstractChannel
) -> None:
    queue = await channel.declare_queue(unique_queue(), durable=True, arguments=QUEUE_ARGUMENTS)
    async with AmqpTransport(amqp_url, routing_key=queue.name) as transport:
        await transport.deliver("job-1", {"id": "R-0002", "name": "Same name"}, {"trace": "t1"})
    message = await queue.get(no_ack=True)
    assert message is not None
    assert json.loads(message.body) == {"id": "R-0002", "name": "Same name"}
    assert message.message_id == "job-1" and message.headers == {"trace": "t1"}
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"


async def test_no_queue_for_the_routing_key_is_unroutable_not_delivered(
    amqp_url: str, channel: AbstractChannel
) -> None:
    queue = await channel.declare_queue(unique_queue(), durable=True, arguments=QUEUE_ARGUMENTS)
    async with AmqpTransport(amqp_url, routing_key=unique_queue("nobody")) as transport:
        with pytest.raises(Unroutable) as caught:
            await transport.deliver("job-1", {"n": 1}, {})
        assert isinstance(caught.value, BadAck)
        await transport.publish("job-2", b"{}", {}, routing_key=queue.name)  # the channel is still good
    assert (await channel.declare_queue(queue.name, passive=True)).declaration_result.message_count == 1


async def test_an_exchange_without_bindings_or_that_does_not_exist_is_unroutable(
    amqp_url: str, channel: AbstractChannel
) -> None:
    exchange = await channel.declare_exchange(unique_queue("asyncq-test-ex"), auto_delete=False)
    try:
        async with AmqpTransport(amqp_url, exchange=exchange.name, routing_key="r") as transport:
            with pytest.raises(Unroutable):
                await transport.deliver("job-1", {}, {})
    finally:
        await exchange.delete()
    async with AmqpTransport(amqp_url, exchange=unique_queue("missing-ex"), routing_key="r") as transport:
        with pytest.raises(Unroutable):
            await transport.deliver("job-1", {}, {})


async def test_a_nack_from_a_full_queue_is_retryable(amqp_url: str, channel: AbstractChannel) -> None:
    arguments = {**QUEUE_ARGUMENTS, "x-max-length": 0, "x-overflow": "reject-publish"}
    queue = await channel.declare_queue(unique_queue(), arguments=arguments)
    async with AmqpTransport(amqp_url, routing_key=queue.name) as transport:
        with pytest.raises(Retryable) as caught:
            await transport.deliver("job-1", {}, {})
    assert not isinstance(caught.value, BadAck)


async def test_no_broker_is_retryable_and_a_bad_body_permanent() -> None:
    async with AmqpTransport("amqp://guest:guest@127.0.0.1:1/", routing_key="q", timeout=2) as transport:
        with pytest.raises(Retryable):
            await transport.deliver("job-1", {}, {})
        with pytest.raises(Permanent):
            await transport.deliver("job-1", {"x": float("nan")}, {})


async def test_declare_runs_on_each_new_channel_and_close_allows_reuse(amqp_url: str) -> None:
    name = unique_queue()
    declared: list[str] = []

    async def declare(channel: AbstractChannel) -> None:
        declared.append(name)
        await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)

    transport = AmqpTransport(amqp_url, routing_key=name, declare=declare)
    await transport.deliver("a", {}, {})
    await transport.deliver("b", {}, {})
    await transport.close()
    await transport.deliver("c", {}, {})
    await transport.close()
    assert declared == [name, name]


def test_a_timeout_that_is_not_a_positive_finite_number_is_refused() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="timeout"):
            AmqpTransport("amqp://guest:guest@127.0.0.1:1/", routing_key="q", timeout=bad)  # type: ignore[arg-type]


async def test_the_fake_records_or_raises() -> None:
    fake = FakeAmqpTransport()
    fake.answers["bad"] = Unroutable("no route")
    await fake.deliver("good", {"a": 1}, {"h": "v"})
    with pytest.raises(Unroutable):
        await fake.deliver("bad", {}, {})
    await fake.close()
    assert fake.published == [("good", b'{"a":1}', {"h": "v"})] and fake.closed
