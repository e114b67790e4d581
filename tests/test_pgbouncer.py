"""Through the run's real PgBouncer (Debian's, its defaults: ``tests/pgbouncer_support.py``), in both pool modes.

- A store URL that does not say it goes through a pooler (``?pooler=``) is refused at open with one line that says
  what to add, and nothing is created: PgBouncer refuses asyncq's startup settings in either mode.
- **Transaction mode** (``?pooler=transaction``): woken by polling, ``?wakeups=listen`` refused before anything
  connects; a queue opens, takes jobs and a pool drains them (the conformance suite runs the rest through it as
  ``postgresql-pgbouncer``, the outbox's and inbox's port suites and the relay's tests too).
- **Session mode** (``?pooler=session``): LISTEN/NOTIFY works. A pool whose poll is a minute, longer than the
  test may run, runs a job another handle enqueued within seconds: only the notification, through PgBouncer, can
  have woken it; so does a relay whose poll is a minute for an item another handle added. A URL that says
  ``session`` for an alias PgBouncer pools by transaction is refused at open: the notification sent to check
  never reaches the listener; a relay (which listens from its first wait) says so once and polls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from pgbouncer_support import Bouncer, schema_alias
from postgres_support import fresh_schema
from waiting import eventually

from asyncq import JobSpec, Pool, Queue
from asyncq.delivery.fake import FakeTransport
from asyncq.errors import StoreError
from asyncq.outbox import Outbox, Relay
from asyncq.store.postgres.queue_store import PostgresQueueStore

pytestmark = [pytest.mark.timeout(60)]

#: An idle pool's and a relay's poll in the session-mode tests: longer than the test may run, so only a
#: notification can wake them.
LONG_POLL_S = 60.0
#: How soon a woken pool or relay must act: far below the poll.
PROMPTLY_S = 10.0


@dataclass(frozen=True)
class Alias:
    """A fresh schema reached through PgBouncer (``schema_alias``) in one pool mode."""

    bouncer: Bouncer
    name: str
    schema: str
    server: str  # the server's own URL, without asyncq's options

    def url(self, **options: str) -> str:
        return self.bouncer.url(self.name, schema=self.schema, **options)


@pytest.fixture(params=["transaction", "session"])
async def alias(request: pytest.FixtureRequest, pgbouncer: Bouncer, postgres_database: str) -> AsyncIterator[Alias]:
    async with fresh_schema() as (url, schema), schema_alias(pgbouncer, url, schema, request.param) as name:
        yield Alias(pgbouncer, name, schema, url.split("?")[0])


@pytest.fixture
async def session(pgbouncer: Bouncer, postgres_database: str) -> AsyncIterator[Alias]:
    async with fresh_schema() as (url, schema), schema_alias(pgbouncer, url, schema, "session") as name:
        yield Alias(pgbouncer, name, schema, url.split("?")[0])


@pytest.fixture
async def transaction(pgbouncer: Bouncer, postgres_database: str) -> AsyncIterator[Alias]:
    async with fresh_schema() as (url, schema), schema_alias(pgbouncer, url, schema, "transaction") as name:
        yield Alias(pgbouncer, name, schema, url.split("?")[0])


async def schemas(server: str, schema: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(server, timeout=5)
    try:
        found: int = await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
        return found
    finally:
        await conn.close()


async def test_a_url_that_does_not_name_the_pooler_is_refused_at_open_saying_what_to_add(alias: Alias) -> None:
    for url in (alias.url(), alias.url(wakeups="poll")):
        with pytest.raises(StoreError, match=r"connection pooler .* add \?pooler=session .* or \?pooler=transaction"):
            await Queue.open(url)
        with pytest.raises(StoreError, match=r"\?pooler=session") as raised:
            await Outbox.open(url)
        assert "\n" not in str(raised.value)  # one line, for the CLI
    assert await schemas(alias.server, alias.schema) == 0  # nothing was created


async def test_listen_or_a_startup_setting_through_a_transaction_pooler_is_refused_before_anything_connects(
    transaction: Alias,
) -> None:
    refused = {
        transaction.url(pooler="transaction", wakeups="listen"): "wakeups=listen cannot work .* transaction mode",
        transaction.url(pooler="session", search_path="x"): "search_path in the URL would be a startup setting",
        transaction.url(pooler="transaction", synchronous_commit="off"): "synchronous_commit in the URL",
    }
    for url, message in refused.items():
        with pytest.raises(ValueError, match=message) as raised:
            await Queue.open(url)
        assert "\n" not in str(raised.value)
    assert await schemas(transaction.server, transaction.schema) == 0


async def test_in_transaction_mode_a_pool_drains_jobs_woken_by_polling(transaction: Alias) -> None:
    async with await Queue.open(transaction.url(pooler="transaction")) as queue:
        assert (await queue.describe())["wakeups"] == "poll"
        await queue.enqueue_many([JobSpec(f"b-{n}", {"n": n}) for n in range(200)])
        seen: list[int] = []
        pool = Pool(queue, concurrency=8, poll_max=0.05)

        @pool.handler()
        async def handle(body: dict[str, int], context: object) -> None:
            seen.append(body["n"])

        await pool.run(burst=True)
        assert sorted(seen) == list(range(200))
        assert (await queue.stats()).by_status["done"] == 200


async def test_a_session_url_for_a_transaction_pooler_is_refused_at_open_as_notifications_are_lost(
    transaction: Alias,
) -> None:
    began = time.monotonic()
    with pytest.raises(StoreError, match=r"did not reach the listening connection .* use \?pooler=transaction") as e:
        await Queue.open(transaction.url(pooler="session"))
    assert "\n" not in str(e.value) and time.monotonic() - began < 30


async def test_in_session_mode_a_pool_is_woken_by_notify_through_pgbouncer(session: Alias) -> None:
    async with (
        await Queue.open(session.url(pooler="session")) as waiting,
        await Queue.open(session.url(pooler="session")) as producer,
    ):
        store = waiting.store
        assert isinstance(store, PostgresQueueStore) and store.wakeups.listening
        assert (await waiting.describe())["wakeups"] == "listen"
        ran = asyncio.Event()
        pool = Pool(waiting, concurrency=2, poll_min=LONG_POLL_S, poll_max=LONG_POLL_S)

        @pool.handler()
        async def handle(body: object, context: object) -> None:
            ran.set()

        running = asyncio.create_task(pool.run())
        try:
            before = store.wakeups.received
            await eventually(lambda: pool_waits(store), "the pool to wait for work", timeout=PROMPTLY_S)
            await producer.enqueue("from-another-handle", {"n": 1})  # its own store: only NOTIFY reaches `waiting`
            await asyncio.wait_for(ran.wait(), PROMPTLY_S)
            assert store.wakeups.received > before and store.wakeups.lost == 0
        finally:
            pool.stop()
            await asyncio.wait_for(running, 30)
        job = await producer.get("from-another-handle")
        assert job is not None and job.status == "done"


async def pool_waits(store: PostgresQueueStore) -> bool:
    return bool(store.wakeups._waiters)


async def test_in_session_mode_a_relay_is_woken_by_notify_through_pgbouncer(session: Alias) -> None:
    url = session.url(pooler="session")
    transport = FakeTransport()
    async with await Outbox.open(url) as outbox, await Outbox.open(url) as producer:
        relay = Relay(outbox, transport, poll_ms=int(LONG_POLL_S * 1000))
        running = asyncio.create_task(relay.run())
        try:
            wakeups = outbox.store.wakeups  # type: ignore[attr-defined]  # the port has no wake-ups
            await eventually(lambda: wakeups.listening and bool(wakeups._waiters), "the relay to wait", timeout=10)
            await producer.add("from-another-handle", {"n": 1})
            await eventually(
                lambda: transport.delivered_ids() == ["from-another-handle"], "the item, sent", timeout=PROMPTLY_S
            )
            assert wakeups.received >= 1 and wakeups.lost == 0
        finally:
            relay.stop()
            await asyncio.wait_for(running, 10)


async def test_a_relay_behind_a_transaction_pooler_said_to_pool_sessions_says_so_once_and_polls(
    transaction: Alias, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay's outbox listens from its first wait, not at open: the same check then fails, is logged once at
    ERROR, and the relay polls from then on."""
    caplog.set_level(logging.ERROR, logger="asyncq.store.postgres")
    url = transaction.url(pooler="session")
    transport = FakeTransport()
    async with await Outbox.open(url) as outbox, await Outbox.open(url) as producer:
        relay = Relay(outbox, transport, poll_ms=200)
        running = asyncio.create_task(relay.run())
        try:
            wakeups = outbox.store.wakeups  # type: ignore[attr-defined]  # the port has no wake-ups
            await eventually(lambda: wakeups.mode == "poll", "the relay's check to fail", timeout=PROMPTLY_S)
            await producer.add("polled", {"n": 1})
            await eventually(lambda: transport.delivered_ids() == ["polled"], "the item, polled", timeout=PROMPTLY_S)
        finally:
            relay.stop()
            await asyncio.wait_for(running, 10)
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1 and "use ?pooler=transaction" in errors[0], errors
