"""The outbox and the inbox on the machine's real PostgreSQL, where the SQLite suites cannot go: an item on the
app's own asyncpg transaction, adds committing in ``seq`` order across connections (the order lock), a relay
delivering to a real aiohttp receiver whose inbox is on PostgreSQL, duplicates applied once (also by two
receivers sharing one inbox, as two hosts would), a receiver SIGKILLed in the middle of its effect, a relay riding
out a lost connection, each component's own migration in one schema, and the AMQP consumer's store opened by URL.
Each test has schemas of its own in this run's database (``postgres_support``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import aiormq
import asyncpg
import pytest
from aiohttp import web
from cli_support import run_cli, run_json
from inbox_children import EFFECTS_DDL  # the child's table: a restarted receiver goes on with it
from postgres_support import fresh_schema, run_database
from waiting import eventually

from asyncq import Queue
from asyncq.amqp import IdempotentConsumer
from asyncq.delivery.fake import FakeTransport
from asyncq.delivery.http import HttpTransport
from asyncq.errors import Conflict, StoreError
from asyncq.inbox import EffectTransaction, Inbox, make_inbox_app
from asyncq.inbox.receiver import read_totals
from asyncq.outbox import Outbox, Relay
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.schema import SCHEMA_VERSION as QUEUE_SCHEMA_VERSION

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

CHILD = Path(__file__).resolve().parent / "inbox_children.py"


@pytest.fixture
def url(postgres_url: str) -> str:
    """A store URL of a fresh schema (the app's tables resolve there too), dropped after the test."""
    return postgres_url


@pytest.fixture
async def sink() -> AsyncIterator[str]:
    """Another fresh schema, for the receiver's inbox."""
    async with fresh_schema() as (found, _schema):
        yield found


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    """The app's own asyncpg connection (its ``search_path`` the test's schema)."""
    conn = await asyncpg.connect(parse_url(url).dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def rows(url: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    async with connected(url) as conn:
        return [tuple(row) for row in await conn.fetch(statement, *args)]


def record_effect(tx: EffectTransaction, event_id: str, body: Any) -> None:
    """One ``effects`` row per application (never deduplicated by itself: the inbox must do it)."""
    tx.execute("INSERT INTO effects (id, at) VALUES ($1, $2)", (event_id, time.monotonic_ns()))


@asynccontextmanager
async def receiver(db: str, effect: Callable[..., None] = record_effect) -> AsyncIterator[tuple[str, Inbox]]:
    """A real aiohttp receiver on 127.0.0.1 (an OS-assigned port) with its inbox on ``db``."""
    app = make_inbox_app(db, effect=effect, ddl=EFFECTS_DDL)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        from asyncq.inbox import INBOX_KEY

        yield f"http://127.0.0.1:{runner.addresses[0][1]}/events", app[INBOX_KEY]
    finally:
        await runner.cleanup()


# -- the app's own transaction ------------------------------------------------------------------------------


async def test_an_item_commits_and_rolls_back_with_the_apps_own_asyncpg_transaction(url: str) -> None:
    async with await Outbox.open(url) as outbox, connected(url) as conn:
        await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        with pytest.raises(RuntimeError, match="the app fails"):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES ('o-1')")
                assert await outbox.add("o-1", {"qty": 1}, connection=conn) is True
                raise RuntimeError("the app fails after both writes")
        assert await rows(url, "SELECT * FROM orders") == [] and await outbox.get("o-1") is None

        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ('o-1')")
            assert await outbox.add("o-1", {"qty": 1}, connection=conn) is True
            assert await outbox.add("o-1", {"qty": 1}, connection=conn) is False  # the same item again
        with pytest.raises(Conflict):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES ('o-2')")
                await outbox.add("o-1", {"qty": 2}, connection=conn)  # another body: the app's block fails
        with pytest.raises(ValueError, match="no transaction open"):
            await outbox.add("o-3", {"qty": 3}, connection=conn)  # it would commit on its own
        with pytest.raises(TypeError, match="asyncpg connection"):
            await outbox.add("o-3", {"qty": 3}, connection=object())
        assert await rows(url, "SELECT * FROM orders") == [("o-1",)]
        assert [(i.id, i.seq, i.state) for i in await outbox.store.head_batch(10)] == [("o-1", 1, "unsent")]

        transport = FakeTransport()
        assert (await Relay(outbox, transport).run_once()).sent == 1
        assert transport.delivered_ids() == ["o-1"]


async def test_a_sqlite_outbox_refuses_a_connection_and_adds_nothing(tmp_path: Path) -> None:
    async with await Outbox.open(str(tmp_path / "app.db")) as outbox:
        with pytest.raises(TypeError, match=r"outbox\.transaction"):
            await outbox.add("o-1", {"qty": 1}, connection=object())
        assert await outbox.get("o-1") is None


async def test_adds_commit_in_seq_order_across_connections(url: str) -> None:
    """An add waits for the order lock of a transaction that added before it, so it is numbered after that one's
    item and commits after it: the relay never finds an item behind one it has already sent."""
    async with await Outbox.open(url) as outbox, connected(url) as app:
        transport = FakeTransport()
        relay = Relay(outbox, transport)
        app_tx = app.transaction()
        await app_tx.start()
        try:
            await outbox.add("first", {"n": 1}, connection=app)
            later = asyncio.create_task(outbox.add("second", {"n": 2}))  # another host's add, in the meantime

            async def waiting_for_the_lock() -> bool:
                found = await rows(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                return bool(found[0][0] == 1)

            await eventually(waiting_for_the_lock, "the second add to wait for the order lock", timeout=15)
            assert not later.done()
            assert (await relay.run_once()).sent == 0  # neither is visible yet
        except BaseException:
            await app_tx.rollback()
            raise
        await app_tx.commit()
        assert await asyncio.wait_for(later, 10) is True
        assert (await relay.run_once()).sent == 2
        assert transport.delivered_ids() == ["first", "second"]
        assert [(i.id, i.seq) for i in [await outbox.get("first"), await outbox.get("second")] if i] == [
            ("first", 1),
            ("second", 2),
        ]


async def test_an_add_from_inside_the_tasks_own_block_is_refused_not_left_waiting(url: str) -> None:
    async with await Outbox.open(url) as outbox:
        async with outbox.transaction() as tx:
            await tx.add("A", {"n": 1})
            with pytest.raises(RuntimeError, match="holds an open transaction"):
                await outbox.add("B", {"n": 2})
        assert [i.id for i in await outbox.store.head_batch(10)] == ["A"]


# -- relay -> receiver, both on PostgreSQL ------------------------------------------------------------------


async def test_the_relay_delivers_to_a_receiver_whose_inbox_is_on_postgresql_and_duplicates_apply_once(
    url: str, sink: str
) -> None:
    async with receiver(sink) as (events, inbox), await Outbox.open(url) as outbox:
        async with outbox.transaction() as tx:
            await tx.execute("CREATE TABLE orders (id text PRIMARY KEY)")
            for n in range(30):
                await tx.execute("INSERT INTO orders VALUES ($1)", (f"o-{n}",))
                await tx.add(f"o-{n}", {"n": n}, topic="orders")
        transport = HttpTransport(events, timeout=5)
        relay = Relay(outbox, transport, batch=64, stats_url=events + "/stats")
        try:
            result = await relay.run_once()
            assert (result.sent, result.stopped) == (30, "idle")
            for n in (0, 7, 29):  # the relay crashed after these ACKs: they are sent again
                await transport.deliver(f"o-{n}", {"n": n}, {})
            figures = await relay.figures()
        finally:
            await transport.close()
        assert await inbox.totals() == {"applied": 30, "duplicates": 3, "conflicts": 0}
    effects = await rows(sink, "SELECT id FROM effects ORDER BY at")
    assert [event_id for (event_id,) in effects] == [f"o-{n}" for n in range(30)]  # once each, in order
    assert figures.unsent == 0
    assert figures.receiver is not None and (figures.receiver.applied, figures.receiver.duplicates) == (30, 3)
    assert await read_totals(sink, 5.0) == {"applied": 30, "duplicates": 3, "conflicts": 0}


async def test_two_receivers_sharing_one_inbox_apply_each_id_once(sink: str) -> None:
    """Two receivers, each with its own pool (two hosts), get the same ids at once; an effect that takes a while
    keeps the first one's transaction open, so the other's insert has to wait for it. Every id is applied once,
    every other answer is a duplicate, and no answer is a 500: the receivers' batches cross (each takes ids in
    the order their requests came), and a batch locks its ids in one order first, so none deadlocks."""

    def slow(tx: EffectTransaction, event_id: str, body: Any) -> None:
        record_effect(tx, event_id, body)
        time.sleep(0.005)

    ids = [f"e-{n}" for n in range(12)]
    answers: list[str] = []
    retried = 0
    async with (
        receiver(sink, slow) as (first, _),
        receiver(sink, slow) as (second, _),
        aiohttp.ClientSession() as session,
    ):

        async def post(target: str, event_id: str) -> None:
            nonlocal retried
            for _ in range(20):
                async with session.post(target, json={"id": event_id}) as response:
                    if response.status == 500:
                        retried += 1
                        continue
                    assert response.status == 200, await response.text()
                    answers.append((await response.json())["status"])
                    return
            raise AssertionError(f"{event_id} kept failing")

        crossing = [(first, i) for i in ids] + [(second, i) for i in reversed(ids)]  # each its receiver's order
        await asyncio.gather(*(post(target, i) for target, i in crossing * 2))
    assert sorted(answers) == ["applied"] * len(ids) + ["duplicate"] * (3 * len(ids)), retried
    assert retried == 0
    effects = await rows(sink, "SELECT id, count(*) FROM effects GROUP BY id ORDER BY id")
    assert effects == [(i, 1) for i in sorted(ids)]
    assert await read_totals(sink, 5.0) == {"applied": len(ids), "duplicates": 3 * len(ids), "conflicts": 0}


@pytest.mark.parametrize("first_outcome", ["commits", "rolls back"])
async def test_a_second_host_waits_for_the_first_ones_transaction_on_the_same_id(sink: str, first_outcome: str) -> None:
    """Receiver 1 is inside the effect of ``e-1`` (its inbox row inserted, not committed) when receiver 2 gets
    ``e-1`` too: receiver 2's insert waits for that transaction. If it commits, receiver 2 answers a duplicate;
    if its effect fails (rolled back), receiver 2 inserts the row and applies the effect itself. Once either way."""
    entered, release = threading.Event(), threading.Event()

    def gated(tx: EffectTransaction, event_id: str, body: Any) -> None:
        record_effect(tx, event_id, body)
        entered.set()
        release.wait(20)
        if first_outcome == "rolls back":
            raise RuntimeError("the first host's effect fails after its write")

    async with (
        receiver(sink, gated) as (first, _),
        receiver(sink) as (second, _),
        aiohttp.ClientSession() as session,
    ):

        async def post(target: str) -> tuple[int, str]:
            async with session.post(target, json={"id": "e-1"}) as response:
                return response.status, (await response.json())["status"]

        one = asyncio.create_task(post(first))
        await asyncio.to_thread(entered.wait, 20)
        two = asyncio.create_task(post(second))

        async def second_waits() -> bool:
            found = await rows(
                sink,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'asyncq' AND wait_event_type = 'Lock'",
            )
            return bool(found[0][0] == 1)

        try:
            await eventually(second_waits, "the second receiver to wait for the first one's lock", timeout=15)
            assert not two.done()
        finally:
            release.set()
        answers = [await one, await two]
    if first_outcome == "commits":
        assert answers == [(200, "applied"), (200, "duplicate")]
    else:
        assert answers == [(500, "failed"), (200, "applied")]
    assert await rows(sink, "SELECT id FROM effects") == [("e-1",)]
    assert await read_totals(sink, 5.0) == {"applied": 1, "duplicates": int(first_outcome == "commits"), "conflicts": 0}


async def test_a_receiver_killed_mid_effect_leaves_neither_its_inbox_row_nor_its_effect(sink: str) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), json.dumps({"db": sink}), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        events = json.loads(await asyncio.wait_for(child.stdout.readline(), 15))["url"]
        async with aiohttp.ClientSession() as session:
            async with session.post(events, json={"id": "e-0"}) as response:
                assert (response.status, (await response.json())["status"]) == (200, "applied")
            posting = asyncio.create_task(session.post(events, json={"id": "e-1", "hang": True}))
            inside = json.loads(await asyncio.wait_for(child.stdout.readline(), 15))
            assert inside["in_effect"] == "e-1"
            [(state,)] = await rows(sink, "SELECT state FROM pg_stat_activity WHERE pid = $1", inside["backend"])
            assert state in ("idle in transaction", "active")  # its rows are written, not committed
            child.kill()
            assert await child.wait() == -signal.SIGKILL
            with pytest.raises(aiohttp.ClientError):
                await posting  # the answer never came: the sender will send e-1 again

        async def backend_gone() -> bool:
            return not await rows(sink, "SELECT 1 FROM pg_stat_activity WHERE pid = $1", inside["backend"])

        # the server saw the connection drop and rolled its transaction back
        await eventually(backend_gone, "the killed receiver's backend to end", timeout=15)
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
    assert await rows(sink, "SELECT id FROM effects ORDER BY id") == [("e-0",)]
    assert await rows(sink, f"SELECT id FROM {parse_url(sink).schema}.inbox ORDER BY id") == [("e-0",)]
    async with receiver(sink) as (events, inbox):  # the sender's retry reaches a restarted receiver
        transport = HttpTransport(events, timeout=5)
        try:
            await transport.deliver("e-1", {"id": "e-1", "hang": True}, {})  # no hang here: record_effect
            await transport.deliver("e-1", {"id": "e-1", "hang": True}, {})
        finally:
            await transport.close()
        assert await inbox.totals() == {"applied": 2, "duplicates": 1, "conflicts": 0}
    assert await rows(sink, "SELECT id FROM effects ORDER BY id") == [("e-0",), ("e-1",)]


# -- failures the relay rides out ---------------------------------------------------------------------------


async def test_a_relay_rides_out_a_connection_the_server_ended(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The relay's call waits on the lease row another transaction holds; the server ends the relay's connection
    (an administrator, a failover): the pass fails with ``PostgresBusy``, which ``run`` logs and waits out; once
    the row is free the item goes, on a new connection of the pool."""
    caplog.set_level(logging.WARNING, logger="asyncq.outbox")
    schema = parse_url(url).schema
    async with await Outbox.open(url) as outbox, connected(url) as admin:
        await outbox.add("A", {"qty": 1})
        transport = FakeTransport()
        relay = Relay(outbox, transport, poll_ms=20)
        blocker = admin.transaction()
        await blocker.start()
        await admin.execute(f"SELECT * FROM {schema}.outbox_lease FOR UPDATE")
        running, held = asyncio.create_task(relay.run()), True
        try:

            async def relay_waits() -> bool:  # and ends its connection
                found = await rows(
                    url,
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'asyncq' AND wait_event_type = 'Lock'",
                )
                for (pid,) in found:
                    await rows(url, "SELECT pg_terminate_backend($1)", pid)
                return bool(found)

            await eventually(relay_waits, "the relay to wait for a lock (its connection then ended)", timeout=15)
            await eventually(
                lambda: _logged(caplog, "terminating connection due to administrator command"),
                "the relay to log its lost connection",
                timeout=15,
            )
            assert transport.delivered_ids() == [] and not running.done()
            await blocker.rollback()
            held = False
            await eventually(lambda: _delivered(transport, ["A"]), "A delivered", timeout=15)
        finally:
            if held:
                await blocker.rollback()
            relay.stop()
            await asyncio.wait_for(running, 10)
        assert (await outbox.get("A")).state == "sent"  # type: ignore[union-attr]


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def _delivered(transport: FakeTransport, ids: list[str]) -> bool:
    return transport.delivered_ids() == ids


# -- one schema, a component each ---------------------------------------------------------------------------


async def test_queue_outbox_and_inbox_keep_their_own_versions_in_one_schema(url: str) -> None:
    schema = parse_url(url).schema
    async with await Queue.open(url) as queue, await Outbox.open(url) as outbox, Inbox(url) as inbox:
        assert await queue.enqueue("j", {}) and await outbox.add("o", {}) and await inbox.receive("e", {}) == "applied"
    versions = await rows(url, f"SELECT component, version FROM {schema}.versions ORDER BY component")
    assert versions == [("inbox", 1), ("outbox", 1), ("queue", QUEUE_SCHEMA_VERSION)]
    await rows(url, f"UPDATE {schema}.versions SET version = 9 WHERE component = 'outbox'")
    before = await rows(url, f"SELECT * FROM {schema}.outbox")
    with pytest.raises(StoreError, match="outbox version 9"):
        await Outbox.open(url)
    assert await rows(url, f"SELECT * FROM {schema}.outbox") == before
    async with Inbox(url) as inbox:  # the others are unaffected
        assert await inbox.receive("e", {}) == "duplicate"


async def test_inboxes_starting_at_once_create_the_effects_table_once(sink: str) -> None:
    inboxes = [Inbox(sink, effect=record_effect, ddl=EFFECTS_DDL) for _ in range(4)]
    await asyncio.gather(*(inbox.open() for inbox in inboxes))  # CREATE TABLE IF NOT EXISTS would race unlocked
    try:
        outcomes = await asyncio.gather(*(inbox.receive("e-1", {"n": 1}) for inbox in inboxes))
    finally:
        await asyncio.gather(*(inbox.close() for inbox in inboxes))
    assert sorted(outcomes) == ["applied", "duplicate", "duplicate", "duplicate"]
    assert await rows(sink, "SELECT id FROM effects") == [("e-1",)]


async def test_reading_a_schema_without_an_inbox_is_an_error_that_creates_nothing(url: str) -> None:
    schema = parse_url(url).schema
    with pytest.raises(StoreError, match="not an asyncq inbox"):
        await read_totals(url, 5.0)
    assert await rows(run_database(), "SELECT 1 FROM pg_namespace WHERE nspname = $1", schema) == []
    with pytest.raises(ValueError, match="durability"):
        await Outbox.open(url, durability="normal")
    with pytest.raises(ValueError, match="schema"):
        await Outbox.open(run_database() + "?schema=Not-A-Name")
    assert await rows(run_database(), "SELECT 1 FROM pg_namespace WHERE nspname = $1", schema) == []


async def test_the_amqp_consumers_store_opens_by_url_as_a_component_of_its_own(url: str) -> None:
    consumer = IdempotentConsumer(url, lambda tx, delivery: None, queue="q", url="amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(aiormq.exceptions.AMQPConnectionError):
        await consumer.start()  # the store opened (and migrated) first, then closed again with the rest
    assert consumer.stopping and not consumer.consuming.is_set()
    schema = parse_url(url).schema
    assert await rows(run_database(), f"SELECT version FROM {schema}.versions WHERE component = 'amqp'") == [(1,)]


async def test_asyncq_status_reads_a_receivers_inbox_by_url(url: str, sink: str, tmp_path: Path) -> None:
    async with await Queue.open(url) as queue, Inbox(sink) as inbox:
        await queue.enqueue("j", {})
        assert [await inbox.receive("e-1", {}), await inbox.receive("e-1", {})] == ["applied", "duplicate"]
    found = await asyncio.to_thread(run_json, "status", "--db", url, "--inbox", sink, cwd=tmp_path)
    assert found["inbox"] == {"file": sink, "applied": 1, "duplicates": 1, "conflicts": 0}
    missing = await asyncio.to_thread(run_cli, "status", "--db", url, "--inbox", url, cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "not an asyncq inbox" in missing.stderr
