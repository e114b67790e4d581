"""The ticket desk's store and outbox relay: a registration commits with its message, and only a
confirmed, routed publish marks the message sent."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import aio_pika
import pytest
from rabbit_support import QUEUE_ARGUMENTS, amqp_url, unique_queue
from ticket_desk_support import import_example

from asyncq.delivery.amqp import AmqpTransport, FakeAmqpTransport, Unroutable

pytestmark = pytest.mark.timeout(30)
__all__ = ["amqp_url"]  # the fixture, imported for pytest

store = import_example("store")
relay = import_example("relay")


def register(path: Path, *names: str) -> list[str]:
    db = store.connect(path)
    try:
        return [store.register(db, name) for name in names]
    finally:
        db.close()


def unsent(path: Path) -> list[str]:
    return [row.message_id for row in store.read(path, store.unsent, 100)]


def test_a_fresh_store_holds_mina_patel_and_ids_follow_in_order(tmp_path: Path) -> None:
    path = tmp_path / "nightjar.db"
    assert register(path, "Same name", "Same name") == ["R-0002", "R-0003"]
    db = store.connect(path)
    try:
        (mina, first, second) = store.registrations(db)
        assert (mina.id, mina.name, mina.ticket_numbers, mina.completed) == ("R-0001", "Mina Patel", (1,), True)
        assert (first.name, second.name) == ("Same name", "Same name")
        assert store.ticket(db, 1).name == "Mina Patel"
    finally:
        db.close()
    bodies = [json.loads(row.body) for row in store.read(path, store.unsent, 10)]
    assert bodies == [{"id": "R-0002", "name": "Same name"}, {"id": "R-0003", "name": "Same name"}]


async def test_a_failed_publish_stops_the_relay_in_order(tmp_path: Path) -> None:
    path = tmp_path / "nightjar.db"
    first, second = register(path, "A", "B")
    fake = FakeAmqpTransport()
    fake.answers[first] = Unroutable("no route")
    with pytest.raises(Unroutable):
        await relay.OutboxRelay(path, fake).run_once()
    assert unsent(path) == [first, second] and fake.published == []
    del fake.answers[first]
    assert await relay.OutboxRelay(path, fake).run_once() == 2
    assert [message_id for message_id, _, _ in fake.published] == [first, second] and unsent(path) == []


async def test_a_confirm_the_busy_store_could_not_record_is_recorded_later_not_published_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker paused inside its transaction holds the one write lock: the relay's ``mark_sent`` fails
    after the broker confirmed. The next run records that confirm instead of publishing the row again."""
    path = tmp_path / "nightjar.db"
    (registration_id,) = register(path, "Normal guest")
    monkeypatch.setattr(store, "BUSY_TIMEOUT", 0.2)
    fake = FakeAmqpTransport()
    outbox = relay.OutboxRelay(path, fake)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await outbox.run_once()
        assert unsent(path) == [registration_id]  # confirmed, but not yet recorded
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    assert await outbox.run_once() == 0
    assert unsent(path) == []
    assert [message_id for message_id, _, _ in fake.published] == [registration_id]  # published once


@pytest.mark.rabbitmq
async def test_an_unroutable_publish_is_never_counted_as_delivered(tmp_path: Path, amqp_url: str) -> None:
    path = tmp_path / "nightjar.db"
    (registration_id,) = register(path, "Normal guest")
    nowhere = AmqpTransport(amqp_url, routing_key=unique_queue("nobody-bound"))  # mandatory, no queue
    try:
        with pytest.raises(Unroutable):
            await relay.OutboxRelay(path, nowhere).run_once()
    finally:
        await nowhere.close()
    assert unsent(path) == [registration_id]

    name = unique_queue("nightjar-test")

    async def declare(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)

    async with AmqpTransport(amqp_url, routing_key=name, declare=declare) as routed:
        assert await relay.OutboxRelay(path, routed).run_once() == 1
    assert unsent(path) == []
    async with await aio_pika.connect(amqp_url) as connection:
        queue = await (await connection.channel()).declare_queue(name, passive=True)
        message = await queue.get(no_ack=True)
        assert message is not None and json.loads(message.body) == {"id": "R-0002", "name": "Normal guest"}
