"""``asyncq.amqp.IdempotentConsumer`` on the real broker and a real SQLite file (and by URL on the real PostgreSQL)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiormq
import pytest
from postgres_support import execute, fresh_schema, postgres_database
from rabbit_support import QUEUE_ARGUMENTS, amqp_url, queue_counts, unique_queue
from waiting import eventually

from asyncq.amqp import Delivery, DeliveryOutcome, EffectTransaction, IdempotentConsumer, dead_messages, redrive
from asyncq.delivery.amqp import AmqpTransport

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(30)]
__all__ = ["amqp_url", "postgres_database"]  # the fixtures, imported for pytest
DEADLINE = 15.0


class Setup:
    """A queue of the test's own, a store with a ``tickets`` table, and what the consumer answered."""

    def __init__(self, tmp_path: Path, url: str, quorum: bool = False) -> None:
        self.url = url
        self.queue = unique_queue()
        self.arguments = {**QUEUE_ARGUMENTS, **({"x-queue-type": "quorum"} if quorum else {})}
        self.db_path = tmp_path / "app.db"
        con = sqlite3.connect(self.db_path)
        con.execute("CREATE TABLE tickets (id TEXT NOT NULL)")
        con.close()
        self.outcomes: list[tuple[str | None, DeliveryOutcome]] = []
        self.transport = AmqpTransport(url, routing_key=self.queue, declare=self.declare)

    async def declare(self, channel: object) -> None:
        await channel.declare_queue(self.queue, durable=True, arguments=self.arguments)  # type: ignore[attr-defined]

    def consumer(
        self, effect: Callable[[EffectTransaction, Delivery], object], **options: object
    ) -> IdempotentConsumer:
        return IdempotentConsumer(
            self.db_path, effect, queue=self.queue, url=self.url, queue_arguments=self.arguments,
            on_outcome=lambda d, outcome: self.outcomes.append((d.key, outcome)), **options,  # type: ignore[arg-type]
        )  # fmt: skip

    async def publish(self, *keys: str) -> None:
        for key in keys:
            await self.transport.deliver(key, {"id": key}, {})

    async def until(self, condition: Callable[[], object], what: str) -> None:
        """``eventually``, the outcomes so far in its failure."""
        await eventually(condition, what, timeout=DEADLINE, interval=0.01, details=lambda: f"outcomes: {self.outcomes}")

    def tickets(self) -> list[str]:
        con = sqlite3.connect(self.db_path)
        try:
            return [key for (key,) in con.execute("SELECT id FROM tickets ORDER BY id")]
        finally:
            con.close()


@pytest.fixture
async def setup(tmp_path: Path, amqp_url: str) -> AsyncIterator[Setup]:
    setup = Setup(tmp_path, amqp_url)
    yield setup
    await setup.transport.close()


async def rows(url: str, statement: str) -> list[tuple[object, ...]]:
    """``statement``'s rows on a connection of the test's own to the store ``url`` names (its ``search_path``)."""
    import asyncpg

    from asyncq.store.postgres.connection import parse_url

    conn = await asyncpg.connect(parse_url(url).dsn)
    try:
        return [tuple(row) for row in await conn.fetch(statement)]
    finally:
        await conn.close()


def issue(db: EffectTransaction, delivery: Delivery) -> None:
    db.execute("INSERT INTO tickets VALUES (?)", (delivery.key,))


async def test_each_key_is_completed_once_and_every_delivery_acked(setup: Setup) -> None:
    await setup.publish("R-1", "R-2", "R-1", "R-3")
    async with setup.consumer(issue, prefetch=10, concurrency=3) as consumer:
        await setup.until(lambda: len(setup.outcomes) == 4, "four answers")
        await setup.until(lambda: queue_counts(setup.queue) == (0, 0), "no ready or unacked message")
    assert setup.tickets() == ["R-1", "R-2", "R-3"]
    assert sorted(setup.outcomes, key=str) == sorted(
        [
            ("R-1", DeliveryOutcome.COMPLETED),
            ("R-2", DeliveryOutcome.COMPLETED),
            ("R-3", DeliveryOutcome.COMPLETED),
            ("R-1", DeliveryOutcome.DUPLICATE),
        ],
        key=str,
    )
    assert (consumer.stats.completed, consumer.stats.duplicates, consumer.stats.requeued) == (3, 1, 0)


async def test_concurrent_writers_all_complete_without_requeues(setup: Setup) -> None:
    keys = [f"R-{n}" for n in range(40)]
    await setup.publish(*keys)
    async with setup.consumer(issue, prefetch=16, concurrency=4) as consumer:
        await setup.until(lambda: len(setup.outcomes) == 40, "forty answers")
    assert sorted(setup.tickets()) == sorted(keys)
    assert consumer.stats.requeued == 0 and consumer.stats.completed == 40


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
async def test_a_poison_message_is_parked_with_its_reason_and_can_be_redriven(
    tmp_path: Path, amqp_url: str, quorum: bool
) -> None:
    setup = Setup(tmp_path, amqp_url, quorum=quorum)
    broken = threading.Event()
    broken.set()

    def flaky(db: EffectTransaction, delivery: Delivery) -> None:
        if broken.is_set() and delivery.key == "poison":
            raise RuntimeError("template missing")
        issue(db, delivery)

    await setup.publish("poison", "R-1")
    async with setup.consumer(flaky, delivery_limit=3) as consumer:
        await setup.until(
            lambda: ("poison", DeliveryOutcome.PARKED) in setup.outcomes, "the poison message to be parked"
        )
        await setup.until(lambda: queue_counts(setup.queue) == (0, 0), "no ready or unacked message")
        (dead,) = dead_messages(setup.db_path)
        assert (dead.key, dead.deliveries, dead.queue) == ("poison", 4, setup.queue)
        assert "delivery limit 3 exceeded" in dead.reason and "RuntimeError: template missing" in dead.reason
        assert consumer.stats.requeued == 3 and setup.tickets() == ["R-1"]

        broken.clear()  # the operator fixed the cause, then redrives
        await redrive(setup.db_path, dead.seq, setup.transport)
        await setup.until(lambda: ("poison", DeliveryOutcome.COMPLETED) in setup.outcomes, "the redriven message")
    assert dead_messages(setup.db_path) == [] and setup.tickets() == ["R-1", "poison"]
    await setup.transport.close()


async def test_on_postgresql_a_poison_message_is_parked_listed_and_redriven_by_url(
    tmp_path: Path, amqp_url: str, postgres_database: str
) -> None:
    """The consumer's store named by a ``postgresql://`` URL: the same rule, ``dead_messages`` read synchronously
    (from inside a running loop too) and ``redrive`` by URL."""
    setup = Setup(tmp_path, amqp_url)
    broken = threading.Event()
    broken.set()

    def flaky(db: EffectTransaction, delivery: Delivery) -> None:
        if broken.is_set() and delivery.key == "poison":
            raise RuntimeError("template missing")
        db.execute("INSERT INTO tickets VALUES ($1)", (delivery.key,))

    async with fresh_schema() as (url, schema):
        await execute(postgres_database, f"CREATE SCHEMA {schema}")
        await execute(postgres_database, f"CREATE TABLE {schema}.tickets (id text NOT NULL)")
        await setup.publish("poison", "R-1")
        consumer = IdempotentConsumer(
            url, flaky, queue=setup.queue, url=amqp_url, queue_arguments=setup.arguments, delivery_limit=2,
            on_outcome=lambda d, outcome: setup.outcomes.append((d.key, outcome)),
        )  # fmt: skip
        async with consumer:
            await setup.until(lambda: ("poison", DeliveryOutcome.PARKED) in setup.outcomes, "the poison parked")
            (dead,) = dead_messages(url)
            assert (dead.key, dead.deliveries, dead.queue) == ("poison", 3, setup.queue)
            assert "delivery limit 2 exceeded" in dead.reason and "RuntimeError: template missing" in dead.reason
            broken.clear()
            await redrive(url, dead.seq, setup.transport)
            await setup.until(lambda: ("poison", DeliveryOutcome.COMPLETED) in setup.outcomes, "the redriven one")
        assert dead_messages(url) == []
        assert sorted(await rows(url, "SELECT id FROM tickets")) == [("R-1",), ("poison",)]
    await setup.transport.close()


async def test_prefetch_bounds_the_unacknowledged_deliveries(setup: Setup) -> None:
    gate = threading.Event()

    def held(db: EffectTransaction, delivery: Delivery) -> None:
        gate.wait(DEADLINE)
        issue(db, delivery)

    await setup.publish(*(f"R-{n}" for n in range(7)))
    async with setup.consumer(held, prefetch=3, concurrency=1):
        await setup.until(lambda: queue_counts(setup.queue) == (4, 3), "three deliveries held, four ready")
        gate.set()
        await setup.until(lambda: len(setup.outcomes) == 7, "seven answers")
    assert len(setup.tickets()) == 7


async def test_graceful_stop_finishes_the_running_effect_and_returns_the_rest(setup: Setup) -> None:
    entered, gate = threading.Event(), threading.Event()

    def held(db: EffectTransaction, delivery: Delivery) -> None:
        entered.set()
        gate.wait(DEADLINE)
        issue(db, delivery)

    await setup.publish(*(f"R-{n}" for n in range(5)))
    consumer = setup.consumer(held, prefetch=5, concurrency=1)
    await consumer.start()
    running = asyncio.create_task(consumer.run())
    await setup.until(entered.is_set, "the first effect to start")
    stopping = asyncio.create_task(consumer.stop())
    await setup.until(lambda: consumer.stopping, "the stop to begin")
    gate.set()
    await stopping
    await running  # returns quietly after stop()
    assert setup.tickets() == ["R-0"] and ("R-0", DeliveryOutcome.COMPLETED) in setup.outcomes
    await setup.until(lambda: queue_counts(setup.queue) == (4, 0), "the four unstarted deliveries back in the queue")


def store_threads() -> set[threading.Thread]:
    """The store connection threads alive in this process (aiosqlite names each after its worker)."""
    return {thread for thread in threading.enumerate() if "_connection_worker_thread" in thread.name}


async def test_run_returns_only_once_a_stop_has_closed_the_store(setup: Setup) -> None:
    """As a SIGTERM handler does it: ``stop`` in a task of its own, and the app waits only for ``run``. The
    broker connection closes first; ``run`` must still wait for the store, or the process cannot exit. (The
    consumer's own threads are followed, not a count: another test's connection may end meanwhile.)"""
    before = store_threads()
    consumer = setup.consumer(issue, concurrency=3)
    await consumer.start()
    own = store_threads() - before
    assert len(own) == 3
    running = asyncio.create_task(consumer.run())
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(consumer.stop()))
    await asyncio.wait_for(running, DEADLINE)
    assert not any(thread.is_alive() for thread in own)


def test_settings_are_checked() -> None:
    for bad in ({"prefetch": 0}, {"prefetch": 65_536}, {"concurrency": 0}, {"delivery_limit": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            IdempotentConsumer("x.db", issue, queue="q", **bad)  # type: ignore[arg-type]


async def test_a_failed_start_closes_what_it_opened(tmp_path: Path) -> None:
    consumer = IdempotentConsumer(tmp_path / "app.db", issue, queue="q", url="amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(aiormq.exceptions.AMQPConnectionError):
        await consumer.start()
    assert consumer.stopping and not consumer.consuming.is_set()
    await consumer.run()  # returns at once: it was stopped
