"""The idempotent consumer's store, through its port (``asyncq.store.port.amqp``), on a real SQLite file (no
broker needed); and the SQLite driver's own ``process_delivery`` on an app's ``sqlite3`` connection."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from asyncq.amqp import Delivery, EffectTransaction, Outcome
from asyncq.errors import Permanent
from asyncq.sqlite import process_delivery
from asyncq.store.opening import open_amqp_store
from asyncq.store.port.amqp import AmqpStore
from asyncq.store.sqlite.amqp import TABLES

pytestmark = pytest.mark.timeout(10)
LIMIT = 3


class Crash(BaseException):
    """Stands for the process dying inside the effect: nothing after it runs."""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE tickets (id TEXT NOT NULL)")
    con.close()
    return path


@pytest.fixture
async def store(db: Path) -> AsyncIterator[AmqpStore]:
    store = await open_amqp_store(db, connections=2)
    yield store
    await store.close()


def issue(tx: EffectTransaction, delivery: Delivery) -> None:
    tx.execute("INSERT INTO tickets VALUES (?)", (delivery.key,))


def fail(tx: EffectTransaction, delivery: Delivery) -> None:
    issue(tx, delivery)
    raise RuntimeError("printer jammed")


def refuse(tx: EffectTransaction, d: Delivery) -> None:
    issue(tx, d)
    raise Permanent("no such workshop")


def delivery(key: str | None = "R-1", *, redelivered: bool = False, count: int | None = None) -> Delivery:
    return Delivery(key, b'{"id": "R-1"}', "q", redelivered, count, {"h": "v"}, "application/json")


async def process(store: AmqpStore, d: Delivery, effect=issue) -> Outcome:  # type: ignore[no-untyped-def]
    return await store.process(d, effect, delivery_limit=LIMIT, now_ms=1_000)


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, read through an independent connection."""
    con = sqlite3.connect(db)
    try:
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {table: sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr) for table in tables}
    finally:
        con.close()


def counts(db: Path) -> tuple[int, int]:
    """Tickets and completion keys."""
    rows = dump(db)
    return len(rows["tickets"]), len(rows["asyncq_amqp_completed"])


async def test_effect_and_key_commit_together_and_a_redelivery_is_a_duplicate(store: AmqpStore, db: Path) -> None:
    assert await process(store, delivery()) is Outcome.COMPLETED
    assert counts(db) == (1, 1)
    assert await process(store, delivery(redelivered=True)) is Outcome.DUPLICATE
    assert await process(store, delivery()) is Outcome.DUPLICATE  # published twice, not redelivered
    assert counts(db) == (1, 1)
    assert Outcome.DUPLICATE.acks and not Outcome.RETRY.acks


async def test_a_failing_effect_rolls_back_with_its_key_and_is_retried(store: AmqpStore, db: Path) -> None:
    assert await process(store, delivery(), fail) is Outcome.RETRY
    assert counts(db) == (0, 0)
    assert await process(store, delivery(redelivered=True)) is Outcome.COMPLETED
    assert counts(db) == (1, 1) and dump(db)["asyncq_amqp_attempts"] == []


async def test_past_the_delivery_limit_the_message_is_parked_with_its_reason(store: AmqpStore, db: Path) -> None:
    assert await process(store, delivery(), fail) is Outcome.RETRY
    for _ in range(LIMIT - 1):
        assert await process(store, delivery(redelivered=True), fail) is Outcome.RETRY
    assert await process(store, delivery(redelivered=True), fail) is Outcome.PARKED
    (dead,) = await store.dead_messages()
    assert dead.key == "R-1" and dead.deliveries == LIMIT + 1 and dead.queue == "q"
    assert "delivery limit 3 exceeded" in dead.reason and "RuntimeError: printer jammed" in dead.reason
    assert (dead.body, dead.headers, dead.content_type) == (b'{"id": "R-1"}', {"h": "v"}, "application/json")
    assert counts(db) == (0, 0)
    # the ack of the parking was lost: the redelivery is answered as parked again, once
    assert await process(store, delivery(redelivered=True)) is Outcome.PARKED
    assert len(await store.dead_messages()) == 1 and counts(db) == (0, 0)


async def test_a_message_that_crashes_the_process_is_still_counted(store: AmqpStore) -> None:
    def crash(tx: EffectTransaction, d: Delivery) -> None:
        raise Crash

    with pytest.raises(Crash):
        await process(store, delivery(), crash)
    for _ in range(LIMIT - 1):
        with pytest.raises(Crash):
            await process(store, delivery(redelivered=True), crash)
    assert await process(store, delivery(redelivered=True), crash) is Outcome.PARKED
    assert "last error: none seen" in (await store.dead_messages())[0].reason


async def test_a_quorum_queues_delivery_count_is_honoured(store: AmqpStore) -> None:
    assert await process(store, delivery(redelivered=True, count=LIMIT), fail) is Outcome.PARKED
    assert (await store.dead_messages())[0].deliveries == LIMIT + 1


async def test_permanent_and_keyless_messages_are_parked_at_once(store: AmqpStore, db: Path) -> None:
    assert await process(store, delivery("R-2"), refuse) is Outcome.PARKED
    assert await process(store, delivery(None)) is Outcome.PARKED
    reasons = [dead.reason for dead in await store.dead_messages()]
    assert reasons == ["permanent: no such workshop", "no message id to use as completion key"]
    assert counts(db) == (0, 0)


async def test_a_parked_key_published_again_runs_and_leaves_the_dead_list(store: AmqpStore, db: Path) -> None:
    await process(store, delivery("R-3"), refuse)
    (dead,) = await store.dead_messages()
    assert await store.get_dead(dead.seq) == dead and await store.get_dead(dead.seq + 1) is None
    assert await process(store, delivery("R-3")) is Outcome.COMPLETED
    assert await store.dead_messages() == [] and counts(db) == (1, 1)
    assert await store.forget_dead(dead.seq) is False


@pytest.mark.parametrize("statement", ["COMMIT", "ROLLBACK", "END"])
async def test_an_effect_cannot_commit_early(store: AmqpStore, db: Path, statement: str) -> None:
    """A statement that would commit the ticket without its key is refused before it runs: the delivery is
    retried, nothing of it is kept but the noted error, and no transaction is left open."""
    before = dump(db)

    def early(tx: EffectTransaction, d: Delivery) -> None:
        issue(tx, d)
        tx.execute(statement)

    assert await process(store, delivery(), early) is Outcome.RETRY
    after = dump(db)
    [(key, deliveries, error)] = after.pop("asyncq_amqp_attempts")
    assert (key, deliveries) == ("R-1", 1) and "refused" in error
    assert after == {name: rows for name, rows in before.items() if name != "asyncq_amqp_attempts"}
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # no transaction was left open: the write lock is free at once
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert await process(store, delivery(redelivered=True)) is Outcome.COMPLETED


async def test_a_held_effect_leaves_the_stores_other_connection_free(store: AmqpStore, db: Path) -> None:
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
    assert await running is Outcome.COMPLETED and counts(db) == (1, 1)


def test_process_delivery_runs_the_rule_on_an_apps_sqlite3_connection(db: Path) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        for statement in TABLES:
            con.execute(statement)
        assert process_delivery(con, delivery(), issue, delivery_limit=LIMIT, now=5) is Outcome.COMPLETED
        assert process_delivery(con, delivery(redelivered=True), issue, delivery_limit=LIMIT, now=6) is (
            Outcome.DUPLICATE
        )
        assert not con.in_transaction
    finally:
        con.close()
    assert counts(db) == (1, 1) and dump(db)["asyncq_amqp_completed"] == [("R-1", 5)]


async def test_a_bad_path_is_refused_before_anything_opens() -> None:
    for bad in ("", ":memory:", "postgresql://localhost/app", 7):
        with pytest.raises(ValueError, match="database"):
            await open_amqp_store(bad, connections=1)
