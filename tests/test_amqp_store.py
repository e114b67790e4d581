"""The idempotent consumer's store, through its port (``asyncq.store.port.amqp``), on each driver: a real SQLite
file and a fresh schema of the machine's PostgreSQL (no broker needed); and SQLite's own ``process_delivery`` on an
app's ``sqlite3`` connection."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from postgres_support import execute, fresh_schema, postgres_database, run_database

from asyncq.amqp import Delivery, DeliveryOutcome, EffectTransaction
from asyncq.errors import Permanent
from asyncq.sqlite import process_delivery
from asyncq.store.opening import open_amqp_store
from asyncq.store.port.amqp import AmqpStore
from asyncq.store.postgres.connection import parse_url
from asyncq.store.sqlite.amqp import TABLES

pytestmark = pytest.mark.timeout(10)
__all__ = ["postgres_database"]  # the fixture, imported for pytest
LIMIT = 3


class Crash(BaseException):
    """Stands for the process dying inside the effect: nothing after it runs."""


class Place:
    """A consumer store's home with the app's ``tickets`` table: a SQLite file, or a fresh PostgreSQL schema (the
    app's tables resolved there by ``search_path``), read back through an independent connection."""

    def __init__(self, target: str, dialect: str) -> None:
        self.target = target
        self.dialect = dialect

    async def rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of ``table`` (the consumer's tables by their short name: ``completed``, ``attempts``…)."""
        if self.dialect == "sqlite":
            return dump(Path(self.target))[table if table == "tickets" else f"asyncq_amqp_{table}"]
        conn = await asyncpg.connect(parse_url(self.target).dsn)
        try:
            name = table if table == "tickets" else f"amqp_{table}"
            return sorted((tuple(row) for row in await conn.fetch(f"SELECT * FROM {name}")), key=repr)
        finally:
            await conn.close()

    async def counts(self) -> tuple[int, int]:
        """Tickets and completion keys."""
        return len(await self.rows("tickets")), len(await self.rows("completed"))


@pytest.fixture(params=["sqlite", "postgresql"])
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE tickets (id TEXT NOT NULL)")
        con.close()
        yield Place(str(path), "sqlite")
        return
    request.getfixturevalue("postgres_database")
    async with fresh_schema() as (url, schema):
        await execute(run_database(), f"CREATE SCHEMA {schema}")
        await execute(run_database(), f"CREATE TABLE {schema}.tickets (id text NOT NULL)")
        yield Place(url, "postgresql")


@pytest.fixture
async def store(place: Place) -> AsyncIterator[AmqpStore]:
    store = await open_amqp_store(place.target, connections=2)
    yield store
    await store.close()


TICKET = {"sqlite": "INSERT INTO tickets VALUES (?)", "postgresql": "INSERT INTO tickets VALUES ($1)"}


def issue(tx: EffectTransaction, delivery: Delivery) -> None:
    tx.execute(TICKET[tx.dialect], (delivery.key,))


def fail(tx: EffectTransaction, delivery: Delivery) -> None:
    issue(tx, delivery)
    raise RuntimeError("printer jammed")


def refuse(tx: EffectTransaction, d: Delivery) -> None:
    issue(tx, d)
    raise Permanent("no such workshop")


def delivery(key: str | None = "R-1", *, redelivered: bool = False, count: int | None = None) -> Delivery:
    return Delivery(key, b'{"id": "R-1"}', "q", redelivered, count, {"h": "v"}, "application/json")


async def process(store: AmqpStore, d: Delivery, effect=issue) -> DeliveryOutcome:  # type: ignore[no-untyped-def]
    return await store.process(d, effect, delivery_limit=LIMIT, now_ms=1_000)


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, read through an independent connection."""
    con = sqlite3.connect(db)
    try:
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {table: sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr) for table in tables}
    finally:
        con.close()


async def test_effect_and_key_commit_together_and_a_redelivery_is_a_duplicate(store: AmqpStore, place: Place) -> None:
    assert await process(store, delivery()) is DeliveryOutcome.COMPLETED
    assert await place.counts() == (1, 1)
    assert await process(store, delivery(redelivered=True)) is DeliveryOutcome.DUPLICATE
    assert await process(store, delivery()) is DeliveryOutcome.DUPLICATE  # published twice, not redelivered
    assert await place.counts() == (1, 1)
    assert DeliveryOutcome.DUPLICATE.acks and not DeliveryOutcome.RETRY.acks


async def test_a_failing_effect_rolls_back_with_its_key_and_is_retried(store: AmqpStore, place: Place) -> None:
    assert await process(store, delivery(), fail) is DeliveryOutcome.RETRY
    assert await place.counts() == (0, 0)
    assert await process(store, delivery(redelivered=True)) is DeliveryOutcome.COMPLETED
    assert await place.counts() == (1, 1) and await place.rows("attempts") == []


async def test_past_the_delivery_limit_the_message_is_parked_with_its_reason(store: AmqpStore, place: Place) -> None:
    assert await process(store, delivery(), fail) is DeliveryOutcome.RETRY
    for _ in range(LIMIT - 1):
        assert await process(store, delivery(redelivered=True), fail) is DeliveryOutcome.RETRY
    assert await process(store, delivery(redelivered=True), fail) is DeliveryOutcome.PARKED
    (dead,) = await store.dead_messages()
    assert dead.key == "R-1" and dead.deliveries == LIMIT + 1 and dead.queue == "q"
    assert "delivery limit 3 exceeded" in dead.reason and "RuntimeError: printer jammed" in dead.reason
    assert (dead.body, dead.headers, dead.content_type) == (b'{"id": "R-1"}', {"h": "v"}, "application/json")
    assert await place.counts() == (0, 0)
    # the ack of the parking was lost: the redelivery is answered as parked again, once
    assert await process(store, delivery(redelivered=True)) is DeliveryOutcome.PARKED
    assert len(await store.dead_messages()) == 1 and await place.counts() == (0, 0)


async def test_a_message_that_crashes_the_process_is_still_counted(store: AmqpStore) -> None:
    def crash(tx: EffectTransaction, d: Delivery) -> None:
        raise Crash

    with pytest.raises(Crash):
        await process(store, delivery(), crash)
    for _ in range(LIMIT - 1):
        with pytest.raises(Crash):
            await process(store, delivery(redelivered=True), crash)
    assert await process(store, delivery(redelivered=True), crash) is DeliveryOutcome.PARKED
    assert "last error: none seen" in (await store.dead_messages())[0].reason


async def test_a_quorum_queues_delivery_count_is_honoured(store: AmqpStore) -> None:
    assert await process(store, delivery(redelivered=True, count=LIMIT), fail) is DeliveryOutcome.PARKED
    assert (await store.dead_messages())[0].deliveries == LIMIT + 1


async def test_permanent_and_keyless_messages_are_parked_at_once(store: AmqpStore, place: Place) -> None:
    assert await process(store, delivery("R-2"), refuse) is DeliveryOutcome.PARKED
    assert await process(store, delivery(None)) is DeliveryOutcome.PARKED
    reasons = [dead.reason for dead in await store.dead_messages()]
    assert reasons == ["permanent: no such workshop", "no message id to use as completion key"]
    assert await place.counts() == (0, 0)


async def test_a_parked_key_published_again_runs_and_leaves_the_dead_list(store: AmqpStore, place: Place) -> None:
    await process(store, delivery("R-3"), refuse)
    (dead,) = await store.dead_messages()
    assert await store.get_dead(dead.seq) == dead and await store.get_dead(dead.seq + 1) is None
    assert await process(store, delivery("R-3")) is DeliveryOutcome.COMPLETED
    assert await store.dead_messages() == [] and await place.counts() == (1, 1)
    assert await store.forget_dead(dead.seq) is False


@pytest.mark.parametrize("statement", ["COMMIT", "ROLLBACK", "END"])
async def test_an_effect_cannot_commit_early(store: AmqpStore, place: Place, statement: str) -> None:
    """A statement that would commit the ticket without its key is refused before it runs: the delivery is
    retried, nothing of it is kept but the noted error, and no transaction is left open."""
    kept = ("tickets", "completed", "dead")
    before = [await place.rows(table) for table in kept]

    def early(tx: EffectTransaction, d: Delivery) -> None:
        issue(tx, d)
        tx.execute(statement)

    assert await process(store, delivery(), early) is DeliveryOutcome.RETRY
    [(key, deliveries, error)] = await place.rows("attempts")
    assert (key, deliveries) == ("R-1", 1) and "refused" in error
    assert [await place.rows(table) for table in kept] == before
    if place.dialect == "sqlite":
        other = sqlite3.connect(place.target, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # no transaction was left open: the write lock is free at once
            other.execute("ROLLBACK")
        finally:
            other.close()
    assert await process(store, delivery(redelivered=True)) is DeliveryOutcome.COMPLETED


async def test_a_held_effect_leaves_the_stores_other_connection_free(store: AmqpStore, place: Place) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(tx: EffectTransaction, d: Delivery) -> None:
        entered.set()
        release.wait(5)
        issue(tx, d)

    running = asyncio.create_task(process(store, delivery("R-9"), held))
    try:
        assert await asyncio.to_thread(entered.wait, 5)
        assert await asyncio.wait_for(store.dead_messages(), 2) == []  # served by the second connection
        assert not running.done()
    finally:
        release.set()
    assert await running is DeliveryOutcome.COMPLETED and await place.counts() == (1, 1)


def test_process_delivery_runs_the_rule_on_an_apps_sqlite3_connection(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("CREATE TABLE tickets (id TEXT NOT NULL)")
        for statement in TABLES:
            con.execute(statement)
        assert process_delivery(con, delivery(), issue, delivery_limit=LIMIT, now=5) is DeliveryOutcome.COMPLETED
        assert process_delivery(con, delivery(redelivered=True), issue, delivery_limit=LIMIT, now=6) is (
            DeliveryOutcome.DUPLICATE
        )
        assert not con.in_transaction
    finally:
        con.close()
    rows = dump(db)
    assert len(rows["tickets"]) == 1 and rows["asyncq_amqp_completed"] == [("R-1", 5)]


async def test_a_bad_path_is_refused_before_anything_opens() -> None:
    for bad in ("", ":memory:", 7):
        with pytest.raises(ValueError, match="database"):
            await open_amqp_store(bad, connections=1)
    with pytest.raises(ValueError, match="schema"):
        await open_amqp_store("postgresql://127.0.0.1:1/app?schema=Not-A-Name", connections=1)


async def test_two_consumers_given_the_same_key_at_once_run_its_effect_once(store: AmqpStore, place: Place) -> None:
    """As two hosts would: the second waits for the first one's transaction, then finds the key completed."""
    entered, release = threading.Event(), threading.Event()

    def held(tx: EffectTransaction, d: Delivery) -> None:
        issue(tx, d)
        entered.set()
        release.wait(5)

    other = await open_amqp_store(place.target, connections=1)
    try:
        first = asyncio.create_task(process(store, delivery("R-7"), held))
        assert await asyncio.to_thread(entered.wait, 5)
        second = asyncio.create_task(process(other, delivery("R-7")))
        done, _ = await asyncio.wait([second], timeout=0.2)
        assert not done  # it waits for the first transaction (a bounded look, not a synchronisation)
        release.set()
        assert (await first, await second) == (DeliveryOutcome.COMPLETED, DeliveryOutcome.DUPLICATE)
    finally:
        release.set()
        await other.close()
    assert await place.counts() == (1, 1)
