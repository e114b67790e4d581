"""Chaos on each consumer store: 200 messages on the real broker, and a consumer process SIGKILLed again and again
(after a random number of answers, with other deliveries mid-effect or between COMMIT and ack), then left to
drain. Afterwards every key has exactly one ticket, nothing is ready or unacknowledged, nothing is parked and no
delivery count is left: on a SQLite file and on PostgreSQL (a fresh schema), the same test."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from postgres_support import execute, fresh_schema, postgres_database
from rabbit_support import QUEUE_ARGUMENTS, amqp_url, queue_counts, unique_queue
from ticket_desk_support import Child
from waiting import eventually_sync

from asyncq.delivery.amqp import AmqpTransport

MESSAGES = int(os.environ.get("ASYNCQ_CHAOS_MESSAGES", "200"))
KILLS = int(os.environ.get("ASYNCQ_CHAOS_KILLS", "5"))
#: A consumer is killed after a random 5 … this many answers (so the drain still has work left).
ANSWERS_BEFORE_KILL = MESSAGES // (KILLS + 2)
CHILD = Path(__file__).resolve().parent / "amqp_children.py"

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120 + MESSAGES // 10 + KILLS * 5)]
__all__ = ["amqp_url", "postgres_database"]  # the fixtures, imported for pytest


class Store:
    """Where the consumer keeps its keys and the app its ``tickets``, read back through a connection of the test's."""

    def __init__(self, target: str, dialect: str) -> None:
        self.target = target
        self.dialect = dialect

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        if self.dialect == "sqlite":
            con = sqlite3.connect(self.target)
            try:
                return con.execute(statement).fetchall()
            finally:
                con.close()
        from postgres_support import run_in_thread

        async def fetch() -> list[tuple[Any, ...]]:
            import asyncpg

            from asyncq.store.postgres.connection import parse_url

            conn = await asyncpg.connect(parse_url(self.target).dsn)
            try:
                return [tuple(row) for row in await conn.fetch(statement)]
            finally:
                await conn.close()

        return run_in_thread(fetch)

    def table(self, name: str) -> str:
        """The consumer's table ``name`` (``dead``, ``attempts``) as each driver names it."""
        return f"asyncq_amqp_{name}" if self.dialect == "sqlite" else f"amqp_{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The store of each driver, with the app's ``tickets`` table (no unique key: a second ticket would show)."""
    if request.param == "sqlite":
        path = str(tmp_path / "app.db")
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE tickets (key TEXT NOT NULL)")
        con.close()
        yield Store(path, "sqlite")
        return
    request.getfixturevalue("postgres_database")
    async with fresh_schema() as (url, schema):
        await execute(url.split("?")[0], f"CREATE SCHEMA {schema}")
        await execute(url.split("?")[0], f"CREATE TABLE {schema}.tickets (key text NOT NULL)")
        yield Store(url, "postgresql")


def start(store: Store, queue: str, amqp_url: str) -> Child:
    config = {"store": store.target, "queue": queue, "amqp_url": amqp_url, "queue_arguments": QUEUE_ARGUMENTS}
    child = Child([sys.executable, str(CHILD), json.dumps(config)], dict(os.environ), CHILD.parent)
    child.expect("consuming")
    return child


async def publish(amqp_url: str, queue: str, keys: list[str]) -> None:
    async def declare(channel: Any) -> None:
        await channel.declare_queue(queue, durable=True, arguments=QUEUE_ARGUMENTS)

    transport = AmqpTransport(amqp_url, routing_key=queue, declare=declare)
    try:
        for key in keys:
            await transport.deliver(key, {"id": key}, {})
    finally:
        await transport.close()


async def test_a_sigkilled_consumer_leaves_exactly_one_ticket_per_key(
    store: Store, amqp_url: str, record_property: pytest.RecordProperty
) -> None:
    queue = unique_queue()
    keys = [f"K-{n:04d}" for n in range(MESSAGES)]
    await publish(amqp_url, queue, keys)
    seed = random.randrange(1 << 30)
    pause = random.Random(seed)
    answered: list[list[str]] = []
    tickets = lambda: store.rows("SELECT key FROM tickets")  # noqa: E731
    for _ in range(KILLS):
        child = start(store, queue, amqp_url)
        for _ in range(pause.randint(5, ANSWERS_BEFORE_KILL)):  # killed mid-stream: other deliveries in flight
            child.expect("K-")
        child.process.kill()
        child.wait()
        child.stop()
        answered += [line.split() for line in child.lines if line.startswith("K-")]

    drain = start(store, queue, amqp_url)
    try:
        eventually_sync(lambda: len(tickets()) >= MESSAGES, "a ticket for every key", timeout=60 + MESSAGES // 10)
        eventually_sync(lambda: queue_counts(queue) == (0, 0), "no ready or unacknowledged message", timeout=30)
        drain.process.terminate()  # SIGTERM: a graceful stop
        assert drain.wait() == 0, drain.stderr()
    finally:
        drain.stop()
    answered += [line.split() for line in drain.lines if line.startswith("K-")]

    counts = Counter(key for (key,) in tickets())
    assert sorted(counts) == keys
    assert set(counts.values()) == {1}, {key: n for key, n in counts.items() if n != 1}
    assert store.rows(f"SELECT count(*) FROM {store.table('dead')}") == [(0,)]
    assert store.rows(f"SELECT count(*) FROM {store.table('attempts')}") == [(0,)]
    redelivered = sum(line[2] == "redelivered=True" for line in answered)
    duplicates = sum(line[1] == "duplicate" for line in answered)
    record_property("chaos", {"seed": seed, "kills": KILLS, "redelivered": redelivered, "duplicates": duplicates})
    assert redelivered >= duplicates
