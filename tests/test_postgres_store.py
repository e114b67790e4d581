"""The PostgreSQL store's own behaviour, on the machine's real server (what the conformance suite cannot say for
every store): opening by URL, the schema's migration under the advisory lock, the app's own asyncpg transaction
carrying jobs, ``Queue.transaction()`` with the app's SQL, wake-ups across hosts (one NOTIFY per transaction, a
lost listener, the poll-only mode), exact counts under concurrent writers, prune in bounded batches, and the URL's
checks. Each test has a schema of its own in this run's database (``postgres_support``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from postgres_support import execute, queue_url, run_database
from waiting import eventually

from asyncq import Queue
from asyncq.core.jobs import JobSpec
from asyncq.core.retention import RetentionRule, Windows
from asyncq.errors import Conflict, StoreError
from asyncq.store.postgres import admin
from asyncq.store.postgres.connection import parse_url, redact
from asyncq.store.postgres.queue_store import PostgresQueueStore
from asyncq.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from asyncq.worker.pool import Pool

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000


@pytest.fixture
def clock() -> list[int]:
    return [T0]


@pytest.fixture
async def queue(postgres_url: str, clock: list[int]) -> AsyncIterator[Queue]:
    async with await Queue.open(postgres_url, clock=lambda: clock[0]) as opened:
        yield opened


async def rows(postgres_url: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(parse_url(postgres_url).dsn)
    try:
        return [tuple(row) for row in await conn.fetch(statement, *args)]
    finally:
        await conn.close()


# -- opening ------------------------------------------------------------------------------------------------


async def test_a_url_opens_the_same_facade_and_inspect_tells_what_a_schema_holds(
    postgres_url: str, clock: list[int]
) -> None:
    schema = parse_url(postgres_url).schema
    assert (await Queue.inspect(postgres_url)).kind == "missing"
    assert (await Queue.inspect(postgres_url)).problem == f"no such queue schema: {postgres_url}"
    async with await Queue.open(postgres_url, clock=lambda: clock[0]) as queue:
        assert await queue.enqueue("a", {"n": 1}) is True
        assert await queue.enqueue("a", {"n": 1}) is False
        with pytest.raises(Conflict):
            await queue.enqueue("a", {"n": 2})
        [ticket] = await queue.claim("w1")
        assert await queue.finish(ticket, "ok") == "done"
        found = await queue.describe()
        assert (found["store"], found["schema"], found["schema_version"]) == ("postgresql", schema, PG_SCHEMA_VERSION)
        assert found["settings"]["synchronous_commit"] == "on"
        assert (await queue.stats()).by_status == {"pending": 0, "leased": 0, "done": 1, "dead": 0, "waiting": 0}
        with pytest.raises(NotImplementedError, match="pg_dump"):
            await queue.backup("/tmp/never", force=False)
    state = await Queue.inspect(postgres_url)
    assert (state.kind, state.store, state.schema_version, state.problem) == (
        "queue",
        "postgresql",
        PG_SCHEMA_VERSION,
        None,
    )
    other = queue_url(run_database(), schema + "_app")
    await execute(run_database(), f"CREATE SCHEMA {schema}_app")
    try:
        assert (await Queue.inspect(other)).kind == "empty"
        await execute(run_database(), f"CREATE TABLE {schema}_app.orders (id text)")
        assert (await Queue.inspect(other)).kind == "other"
        with pytest.raises(StoreError, match="not an asyncq queue"):
            await Queue.open(other, read_only=True)
        assert (await Queue.inspect(other)).kind == "other"  # nothing was created
    finally:
        await execute(run_database(), f"DROP SCHEMA {schema}_app CASCADE")


async def test_hosts_opening_a_new_schema_at_once_migrate_it_once(postgres_url: str) -> None:
    stores = await asyncio.gather(*(PostgresQueueStore.open(postgres_url) for _ in range(4)))
    try:
        schema = parse_url(postgres_url).schema
        assert await rows(postgres_url, f"SELECT component, version FROM {schema}.versions") == [
            ("queue", PG_SCHEMA_VERSION)
        ]
        assert [s.capabilities.read_only for s in stores] == [False] * 4
    finally:
        for store in stores:
            await store.close()


async def test_a_schema_of_a_newer_asyncq_is_refused_with_nothing_changed(postgres_url: str) -> None:
    store = await PostgresQueueStore.open(postgres_url)
    await store.close()
    schema = parse_url(postgres_url).schema
    await execute(parse_url(postgres_url).dsn, f"UPDATE {schema}.versions SET version = 99")
    tables = await rows(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema)
    for read_only in (False, True):
        with pytest.raises(StoreError, match="version 99, newer"):
            await PostgresQueueStore.open(postgres_url, read_only=read_only)
    assert (
        await rows(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema) == tables
    )
    assert await rows(postgres_url, f"SELECT version FROM {schema}.versions") == [(99,)]


async def test_the_jobs_table_is_set_for_a_hot_table_of_short_lived_rows(queue: Queue, postgres_url: str) -> None:
    schema = parse_url(postgres_url).schema
    [(options,)] = await rows(
        postgres_url, "SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)", f"{schema}.jobs"
    )
    assert "fillfactor=70" in options and "autovacuum_vacuum_scale_factor=0.01" in options


async def test_a_version_7_schema_gains_tasks_and_retention_rules_with_its_rows_kept(postgres_url: str) -> None:
    """Queue version 8 adds ``task`` (and its index) without reading any body: a row stored before has none, and
    the same id and body again is still the same job (the column is not compared); new task jobs get theirs. A
    queue that set its retention keeps its windows as its rule; one that never did gets none; the index of ended
    jobs is replaced."""
    from asyncq.store.postgres.connection import Migrations, migrate
    from asyncq.store.postgres.schema import QUEUE

    schema = parse_url(postgres_url).schema
    conn = await asyncpg.connect(parse_url(postgres_url).dsn)
    try:
        assert await migrate(conn, schema, Migrations(QUEUE.component, QUEUE.steps[:7])) == 0
        await conn.execute(
            f"INSERT INTO {schema}.jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
            """ deadline) VALUES ('old', 'default', '{"args":{},"task":"send"}', 'done', 1, 3, 1, 0, 9999999999999)"""
        )
        await conn.execute(
            f"INSERT INTO {schema}.queues (queue, retain_done_ms) VALUES ('mail', 60000), ('held', NULL)"
        )
        await conn.execute(
            f"INSERT INTO {schema}.queue_audit (queue, action, at_ms, actor, note)"
            " VALUES ('mail', 'retention', 1, 'ops', 'n'), ('held', 'max_wait', 2, 'ops', 'n')"
        )
    finally:
        await conn.close()
    async with await Queue.open(postgres_url) as queue:
        assert (await queue.describe())["schema_version"] == PG_SCHEMA_VERSION >= 8
        old = await queue.get("old")
        assert old is not None and (old.status, old.task) == ("done", None)
        assert await queue.enqueue("old", {"task": "send", "args": {}}) is False
        assert await queue.enqueue("new", {"task": "send", "args": {}}) is True
        new = await queue.get("new")
        assert new is not None and new.task == "send"
        assert await queue.retention_rules() == [RetentionRule("mail", None, Windows(60_000))]
        assert [(s.queue, s.retain_done_ms) for s in await queue.queue_settings()] == [("held", None), ("mail", 60_000)]
        entry = await queue.set_retention("mail", task="send", done=1)
        assert (entry.seq, entry.task) == (3, "send")
    for index, there in (("jobs_task", True), ("jobs_retained", True), ("jobs_ended", False)):
        assert await rows(postgres_url, "SELECT to_regclass($1) IS NOT NULL", f"{schema}.{index}") == [(there,)]


def test_urls_are_checked_before_anything_connects_and_shown_without_password() -> None:
    target = parse_url("postgresql://app:s3cret@db.example:6432/prod?schema=jobs&wakeups=poll&sslmode=require")
    assert (target.schema, target.wakeups, target.pool_size, target.pooler) == ("jobs", "poll", 4, None)
    assert parse_url("postgresql://h/db?pooler=transaction").wakeups == "poll"  # no LISTEN through it
    assert parse_url("postgresql://h/db?pooler=session&application_name=x&sslmode=disable").wakeups == "listen"
    assert target.location == "postgresql://app@db.example:6432/prod?schema=jobs&wakeups=poll&sslmode=require"
    assert target.dsn == "postgresql://app:s3cret@db.example:6432/prod?sslmode=require"
    assert "s3cret" not in redact("postgres://u:s3cret@h/db?password=s3cret")
    bad = {
        "postgresql://h/db?schema=Jobs": "schema",
        "postgresql://h/db?schema=pg_x": "schema",
        "postgresql://h/db?schema=" + "x" * 51: "schema",
        "postgresql://h/db?schema=a;drop": "schema",
        "postgresql://h/db?wakeups=sometimes": "wakeups",
        "postgresql://h/db?pooler=statement": "pooler must be",
        "postgresql://h/db?pooler=transaction&wakeups=listen": "wakeups=listen cannot work",
        "postgresql://h/db?pooler=session&search_path=app": "search_path in the URL would be a startup setting",
        "postgresql://h/db?pooler=transaction&options=-c%20x%3D1": "options in the URL",
        "postgresql://h/db?pool_size=0": "pool_size",
        "postgresql://h/db?pool_size=1e3": "pool_size",
        "postgresql://h/db?schema=a&schema=b": "twice",
        "postgresql://h:99999/db": "(?i)port",
    }
    for text, word in bad.items():
        with pytest.raises(ValueError, match=word):
            parse_url(text)


async def test_a_url_cannot_lower_the_commit_level_nor_take_a_sqlite_durability(postgres_url: str) -> None:
    with pytest.raises(ValueError, match="synchronous_commit=on"):
        await Queue.open(postgres_url, durability="normal")
    async with await Queue.open(postgres_url + "&synchronous_commit=off") as queue:
        assert (await queue.describe())["settings"]["synchronous_commit"] == "on"


# -- the app's own transaction ------------------------------------------------------------------------------


async def test_jobs_enqueued_on_the_apps_connection_commit_and_roll_back_with_its_rows(
    queue: Queue, postgres_url: str
) -> None:
    conn = await asyncpg.connect(parse_url(postgres_url).dsn)
    try:
        await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ('o1')")
            assert await queue.enqueue("mail-o1", {"order": "o1"}, connection=conn) is True
            assert await queue.get("mail-o1") is None  # not committed yet: other connections do not see it
        with pytest.raises(RuntimeError, match="declined"):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES ('o2')")
                await queue.enqueue_many([JobSpec("mail-o2", {"order": "o2"})], connection=conn)
                raise RuntimeError("payment declined")
        async with conn.transaction():  # a conflict takes back its own batch only; the app decides the rest
            await conn.execute("INSERT INTO orders VALUES ('o3')")
            with pytest.raises(Conflict):
                await queue.enqueue_many(
                    [JobSpec("mail-o3", {"order": "o3"}), JobSpec("mail-o1", {"other": 1})], connection=conn
                )
            assert await queue.enqueue("mail-o3b", {"order": "o3"}, connection=conn) is True
        assert [r[0] for r in await conn.fetch("SELECT id FROM orders ORDER BY id")] == ["o1", "o3"]
    finally:
        await conn.close()
    assert [job.id for job in await queue.list_jobs()] == ["mail-o1", "mail-o3b"]


async def test_the_apps_connection_without_a_transaction_or_of_another_kind_is_refused(
    queue: Queue, postgres_url: str, tmp_path: Any
) -> None:
    conn = await asyncpg.connect(parse_url(postgres_url).dsn)
    try:
        with pytest.raises(ValueError, match="no transaction open"):
            await queue.enqueue("a", {}, connection=conn)
    finally:
        await conn.close()
    with pytest.raises(TypeError, match="asyncpg connection"):
        await queue.enqueue("a", {}, connection=object())
    async with await Queue.open(tmp_path / "q.db") as sqlite_queue:
        with pytest.raises(TypeError, match=r"queue\.transaction\(\)"):
            await sqlite_queue.enqueue("a", {}, connection=conn)
        assert await sqlite_queue.get("a") is None
    assert await queue.list_jobs() == []


async def test_queue_transaction_runs_the_apps_sql_and_refuses_ending_it(queue: Queue) -> None:
    async with queue.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id text PRIMARY KEY, total integer NOT NULL)")
    async with queue.transaction() as tx:
        assert await tx.execute("INSERT INTO orders VALUES ($1, $2) RETURNING id", ["o1", 100]) == [("o1",)]
        assert await tx.enqueue("mail-o1", {"order": "o1"}) is True
        with pytest.raises(TypeError, match="positional"):
            await tx.execute("SELECT 1", {"a": 1})
        for statement in ("COMMIT", " /* c */ commit", "END", "ROLLBACK", "abort", "start transaction", "BEGIN"):
            with pytest.raises(RuntimeError, match="refused"):
                await tx.execute(statement)
        await tx.execute("SAVEPOINT s")
        await tx.execute("ROLLBACK TO SAVEPOINT s")  # the app's savepoints are its own
    async with queue.transaction() as tx:
        assert await tx.execute("SELECT id, total FROM orders") == [("o1", 100)]
    assert (await queue.get("mail-o1")) is not None


# -- wake-ups -----------------------------------------------------------------------------------------------


class Listener:
    """A connection of the test's own listening on the store's channel, counting notifications."""

    def __init__(self, conn: asyncpg.Connection[Any], channel: str) -> None:
        self.conn, self.channel, self.payloads = conn, channel, []

    @classmethod
    async def on(cls, postgres_url: str) -> Listener:
        listener = cls(await asyncpg.connect(parse_url(postgres_url).dsn), f"{parse_url(postgres_url).schema}_wake")
        await listener.conn.add_listener(listener.channel, lambda *args: listener.payloads.append(args[3]))
        return listener

    async def count_until_marker(self) -> int:
        """How many notifications came before a marker sent now (notifications arrive in commit order)."""
        await self.conn.execute("SELECT pg_notify($1, 'marker')", self.channel)
        await eventually(lambda: "marker" in self.payloads, "the marker's notification", timeout=5)
        count = self.payloads.index("marker")
        self.payloads.clear()
        return count


async def test_one_notify_per_transaction_whatever_it_enqueues(queue: Queue, postgres_url: str) -> None:
    listener = await Listener.on(postgres_url)
    try:
        await queue.enqueue_many([JobSpec(f"j{n}", {}) for n in range(200)])
        assert await listener.count_until_marker() == 1
        async with queue.transaction() as tx:
            for n in range(5):
                await tx.enqueue(f"t{n}", {})
        assert await listener.count_until_marker() == 1
        await queue.enqueue_many([JobSpec(f"j{n}", {}) for n in range(200)])  # nothing new: nothing to say
        assert await listener.count_until_marker() == 0
        tickets = await queue.claim("w1", limit=3)
        await queue.finish_many([(t, "retry", 0) for t in tickets])  # ready again: one notification
        assert await listener.count_until_marker() == 1
    finally:
        await listener.conn.close()


async def test_a_waiter_on_another_host_wakes_at_the_commit_and_a_poll_only_one_does_not(postgres_url: str) -> None:
    async with (
        await Queue.open(postgres_url) as producer,
        await Queue.open(postgres_url) as listening,
        await Queue.open(postgres_url + "&wakeups=poll") as polling,
    ):
        woken = asyncio.create_task(listening.wait_for_rows(10))
        polled = asyncio.create_task(polling.wait_for_rows(60))
        wakeups = listening.store.wakeups  # type: ignore[attr-defined]  # the port has no wakeups
        await eventually(lambda: wakeups.listening, "the waiter's LISTEN in place", timeout=5)
        await producer.enqueue("a", {})
        async with asyncio.timeout(5):  # a notification, far below the 10 s poll
            await woken
        assert not polled.done()  # no LISTEN: it learns of other hosts' rows only by its (60 s) poll
        polled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await polled
        assert (await polling.describe())["wakeups"] == "poll"
        local = asyncio.create_task(polling.wait_for_rows(10))
        await asyncio.sleep(0)
        await polling.enqueue("b", {})  # its own commits still wake its own waiters at once
        async with asyncio.timeout(2):
            await local


async def test_a_lost_listener_is_counted_and_waiting_listens_again(postgres_url: str) -> None:
    async with await Queue.open(postgres_url) as producer, await Queue.open(postgres_url) as worker:
        store = worker.store
        assert isinstance(store, PostgresQueueStore) and store.wakeups.listening
        # Only this test's listener: its database, its channel (other runs may be listening on the same server).
        await execute(
            parse_url(postgres_url).dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = $1 AND pid <> pg_backend_pid()",
            f'LISTEN "{store.wakeups.channel}"',
        )
        # the termination callback runs a loop step after the socket closed
        await eventually(lambda: store.wakeups.lost, "the listener's loss to be counted", timeout=5)
        assert (store.wakeups.lost, store.wakeups.listening) == (1, False)
        # A wait starts listening again, in a task of its own that a short wait does not cut: on a loaded machine the
        # new connection takes longer than the wait (make test beside two CPU-bound loops).
        await worker.wait_for_rows(0.01)
        await eventually(lambda: store.wakeups.listening, "the wait's new listener", timeout=5)
        assert store.wakeups.lost == 1
        woken = asyncio.create_task(worker.wait_for_rows(10))
        await asyncio.sleep(0)  # the waiter starts (a notification before it waits would end its wait too)
        await producer.enqueue("a", {})
        async with asyncio.timeout(2):
            await woken


# -- counts and prune ---------------------------------------------------------------------------------------


async def test_counts_stay_exact_under_concurrent_writers_and_folding_keeps_them(postgres_url: str) -> None:
    async with await Queue.open(postgres_url) as first, await Queue.open(postgres_url) as second:
        await first.enqueue_many([JobSpec(f"j{n}", {}, max_attempts=2) for n in range(400)])

        async def work(queue: Queue, owner: str) -> None:
            seen = 0

            async def handle(body: Any, context: Any) -> None:
                nonlocal seen
                seen += 1
                if seen % 3 == 0:
                    raise ValueError("every third attempt fails")

            pool = Pool(queue, owner=owner, concurrency=8)
            pool.register("default", handle)
            await pool.run(burst=True)

        await asyncio.gather(work(first, "a"), work(second, "b"), work(first, "c"))
        schema = parse_url(postgres_url).schema
        truth = dict(await rows(postgres_url, f"SELECT status, count(*) FROM {schema}.jobs GROUP BY status"))
        stats = await first.stats()
        assert {k: v for k, v in stats.by_status.items() if v} == truth and sum(truth.values()) == 400
        assert stats.dead_by_reason == dict(
            await rows(
                postgres_url, f"SELECT reason, count(*) FROM {schema}.jobs WHERE status = 'dead' GROUP BY reason"
            )
        )
    async with await Queue.open(postgres_url) as third:  # opening folds the counters of the backends that are gone
        backends = await rows(postgres_url, f"SELECT DISTINCT backend FROM {schema}.counts")
        assert (0,) in backends and len(backends) <= 3
        assert {k: v for k, v in (await third.stats()).by_status.items() if v} == truth


async def test_prune_deletes_in_bounded_batches_and_keeps_the_counts(
    queue: Queue, clock: list[int], postgres_url: str
) -> None:
    total = admin.PRUNE_BATCH_ROWS * 2 + 500
    await queue.enqueue_many([JobSpec(f"j{n:05d}", {}) for n in range(total)])
    while tickets := await queue.claim("w1", limit=1000):
        await queue.finish_many([(t, "ok", 0) for t in tickets])
    await queue.enqueue("kept", {})
    clock[0] += 10
    assert (await queue.prunable(0.005))[0] == {"done": total, "dead": 0}
    done = await queue.prune(0.005)
    assert (done["deleted"], done["batches"], done["vacuum"]) == (total, 4, "autovacuum")
    assert (await queue.stats()).by_status == {"pending": 1, "leased": 0, "done": 0, "dead": 0, "waiting": 0}
    schema = parse_url(postgres_url).schema
    assert await rows(postgres_url, f"SELECT id FROM {schema}.jobs") == [("kept",)]


async def test_a_notification_while_no_task_waits_ends_the_next_wait_at_once(postgres_url: str) -> None:
    async with await Queue.open(postgres_url) as producer, await Queue.open(postgres_url) as worker:
        store = worker.store
        assert isinstance(store, PostgresQueueStore)
        before = store.wakeups.received
        await producer.enqueue("a", {})  # the worker is busy elsewhere: nobody waits when this arrives
        await eventually(lambda: store.wakeups.received != before, "the notification", timeout=5)
        async with asyncio.timeout(5):  # far below the 60 s poll: the notification ended the wait
            await worker.wait_for_rows(60)
        assert [t.id for t in await worker.claim("w1")] == ["a"]


@pytest.mark.timeout(120)
def test_the_wakeup_benchmark_runs_quick_and_writes_no_docs(tmp_path: Any) -> None:
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    docs = root / "docs" / "benchmarks.md"
    before = hashlib.sha256(docs.read_bytes()).hexdigest()
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "postgres_wakeup.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root), "ASYNCQ_BENCH_POSTGRES": run_database()},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "enqueue commit -> handler start in another process" in done.stdout and "met" in done.stdout
    assert hashlib.sha256(docs.read_bytes()).hexdigest() == before


async def test_the_console_and_the_metrics_read_a_postgresql_queue_unchanged(
    queue: Queue, postgres_url: str, clock: list[int]
) -> None:
    from console_support import Client, serving
    from prometheus_client import CollectorRegistry, generate_latest

    from asyncq.web.metrics import QueueCollector

    await queue.enqueue_many([JobSpec("a", 1), JobSpec("b", 2), JobSpec("c", 3)])
    [ticket] = await queue.claim("w1")
    await queue.finish(ticket, "permanent")
    async with serving(postgres_url) as (base, console), Client(base) as client:
        assert await console.sample_once()
        page = await client.get("/")
        assert page.status == 200
        assert (page.cell("count-pending"), page.cell("count-dead")) == ("2", "1")
        assert "permanent" in (await client.get("/dead")).text
    registry = CollectorRegistry()
    registry.register(QueueCollector(postgres_url, clock=lambda: clock[0]))
    text = (await asyncio.to_thread(generate_latest, registry)).decode()
    assert 'asyncq_jobs{status="pending"} 2.0' in text and 'asyncq_dead_jobs{reason="permanent"} 1.0' in text
