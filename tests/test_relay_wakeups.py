"""The outbox relay woken across hosts on PostgreSQL: a relay polling every 60 s sends an item that another process
or another connection added at once (``LISTEN/NOTIFY``, one notification per adding transaction), and by polling
when it cannot listen (``?wakeups=poll``, a lost listening connection: logged and counted). Each test has a schema of
its own in this run's database (``postgres_support``)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest
from postgres_support import execute, fresh_schema, postgres_database

from asyncq.delivery.fake import FakeTransport
from asyncq.outbox import Outbox, Relay
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.outbox import PostgresOutboxStore

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]
__all__ = ["postgres_database"]  # the fixture, imported for pytest

POLL_MS = 60_000  # the relay's poll: a delivery well before it was woken, not polled
PROMPTLY = 10.0  # seconds: far below the poll


async def until(condition: Callable[[], object], what: str, seconds: float = PROMPTLY) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running_relay(url: str, poll_ms: int = POLL_MS) -> AsyncIterator[tuple[PostgresOutboxStore, FakeTransport]]:
    """A relay on ``url`` in a task, until the block ends; its store and what it delivered."""
    transport = FakeTransport()
    async with await Outbox.open(url) as outbox:
        store = outbox.store
        assert isinstance(store, PostgresOutboxStore)
        relay = Relay(outbox, transport, poll_ms=poll_ms)
        task = asyncio.create_task(relay.run())
        try:
            yield store, transport
        finally:
            relay.stop()
            await asyncio.wait_for(task, 10)


def add_in_another_process(url: str, item_id: str) -> None:
    code = (
        "import asyncio, sys\n"
        "from asyncq.outbox import Outbox\n"
        "async def main():\n"
        "    async with await Outbox.open(sys.argv[1]) as outbox:\n"
        "        assert await outbox.add(sys.argv[2], {'n': 1})\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code, url, item_id], check=True, timeout=30)


async def notifications_of(url: str, channel: str) -> tuple[asyncpg.Connection, list[str]]:
    """A connection of the test's own listening on ``channel``, and the notifications it received."""
    received: list[str] = []
    conn = await asyncpg.connect(parse_url(url).dsn)
    await conn.add_listener(channel, lambda *args: received.append(args[3]))
    return conn, received


async def test_an_item_added_by_another_process_is_sent_at_once_not_at_the_poll() -> None:
    async with fresh_schema() as (url, _schema), running_relay(url) as (store, transport):
        await until(lambda: store.wakeups.listening, "the relay to listen")
        await asyncio.to_thread(add_in_another_process, url, "from-elsewhere")
        await until(lambda: transport.delivered_ids() == ["from-elsewhere"], "the item, sent at once")
        assert store.wakeups.received >= 1 and store.wakeups.lost == 0


async def test_one_notification_per_adding_transaction_on_the_apps_connection_too() -> None:
    async with fresh_schema() as (url, _schema):
        async with await Outbox.open(url) as adder:
            store = adder.store
            assert isinstance(store, PostgresOutboxStore)
            listener, received = await notifications_of(url, store.wakeups.channel)
            try:
                async with adder.transaction() as tx:  # three items, one transaction: one notification
                    for n in range(3):
                        await tx.add(f"tx-{n}", {"n": n})
                conn = await asyncpg.connect(parse_url(url).dsn)
                try:
                    async with conn.transaction():  # the app's own transaction: one notification as well
                        for n in range(3):
                            await adder.add(f"app-{n}", {"n": n}, connection=conn)
                finally:
                    await conn.close()
                assert not await adder.add("tx-0", {"n": 0})  # a repeat adds nothing and notifies nobody
                await execute(parse_url(url).dsn, f"NOTIFY {store.wakeups.channel}, 'end'")  # a marker, sent last
                await until(lambda: received[-1:] == ["end"], "the marker notification")
            finally:
                await listener.close()
        assert received == ["", "", "end"]


async def test_an_item_added_in_an_apps_transaction_elsewhere_wakes_the_relay_at_commit() -> None:
    async with fresh_schema() as (url, _schema), running_relay(url) as (store, transport):
        await until(lambda: store.wakeups.listening, "the relay to listen")
        async with await Outbox.open(url) as other:  # another connection pool: only NOTIFY reaches the relay
            conn = await asyncpg.connect(parse_url(url).dsn)
            try:
                async with conn.transaction():
                    await other.add("a-1", {"n": 1}, connection=conn)
                    await other.add("a-2", {"n": 2}, connection=conn)
            finally:
                await conn.close()
        await until(lambda: transport.delivered_ids() == ["a-1", "a-2"], "both items, sent at once")


async def test_without_listen_the_relay_still_sends_by_polling() -> None:
    async with fresh_schema(wakeups="poll") as (url, _schema), running_relay(url, poll_ms=200) as (store, transport):
        await asyncio.to_thread(add_in_another_process, url, "polled")
        await until(lambda: transport.delivered_ids() == ["polled"], "the item, found by the poll")
        assert (store.wakeups.mode, store.wakeups.listening, store.wakeups.received) == ("poll", False, 0)


async def test_a_lost_listener_is_logged_counted_and_listened_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncq.store.postgres")
    async with fresh_schema() as (url, _schema), running_relay(url) as (store, transport):
        await until(lambda: store.wakeups.listening, "the relay to listen")
        await execute(
            parse_url(url).dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = $1 AND pid <> pg_backend_pid()",
            f'LISTEN "{store.wakeups.channel}"',
        )
        await until(lambda: store.wakeups.lost == 1, "the loss to be counted")
        assert any(record.levelno == logging.WARNING for record in caplog.records)
        await until(lambda: store.wakeups.listening, "the relay to listen again")
        await asyncio.to_thread(add_in_another_process, url, "after-the-loss")
        await until(lambda: transport.delivered_ids() == ["after-the-loss"], "the item, sent at once again")
