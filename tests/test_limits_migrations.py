"""The limits' schema versions (SQLite v11, PostgreSQL v8) from the version before, with rows: jobs, a queue's
settings and its audit are kept (the SQLite audit rebuilt for its CHECK keeps its seqs, and the next move goes on
from the highest); the new columns start empty (no limit, no limit key), and limits work at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from asyncq import Queue
from asyncq.core.flow_limits import Limits
from asyncq.store.postgres.connection import Migrations, migrate, parse_url
from asyncq.store.postgres.schema import QUEUE
from asyncq.store.sqlite.migrations import MIGRATIONS

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
_JOB = (
    "INSERT INTO {jobs} (id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority,"
    " unique_key) VALUES ('old', 'mail', '{{}}', 'pending', 0, 3, 0, 0, 9999999999999, 4, 'k')"
)
_AUDIT = (
    "INSERT INTO {audit} (queue, action, at_ms, actor, note, max_wait_ms, retain_done_ms)"
    " VALUES ('mail', 'retention', 1, 'ops', 'a week', NULL, 604800000)"
)
_SETTINGS = "INSERT INTO {queues} (queue, max_wait_ms, retain_done_ms) VALUES ('mail', 60000, 604800000)"


async def check_migrated(queue: Queue) -> None:
    job = await queue.get("old")
    assert job is not None and (job.priority, job.unique_key, job.limit_key) == (4, "k", None)
    [old] = await queue.queue_audit("mail")
    assert (old.seq, old.action, old.retain_done_ms, old.limits) == (1, "retention", 604_800_000, Limits())
    [settings] = await queue.queue_settings()
    assert (settings.max_wait_ms, settings.retain_done_ms, settings.limits) == (60_000, 604_800_000, Limits())
    entry = await queue.set_limits("mail", concurrency=1)
    assert entry.seq == 2 and entry.limits == Limits(concurrency=1)
    assert await queue.enqueue("new", {}, queue="mail", limit_key="tenant") is True
    assert [ticket.id for ticket in await queue.claim("w1", queue="mail", limit=5)] == ["old"]  # one slot


async def test_a_sqlite_version_10_file_gets_the_limits_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v10.db"
    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:10]:
        for statement in step:
            con.execute(statement)
    con.execute(_JOB.format(jobs="asyncq_jobs"))
    con.execute(_AUDIT.format(audit="asyncq_queue_audit"))
    con.execute(_SETTINGS.format(queues="asyncq_queues"))
    con.execute("PRAGMA user_version = 10")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        await check_migrated(queue)
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),) == (11,)
    finally:
        con.close()


async def test_a_postgresql_version_7_schema_gets_the_limits_with_its_rows(postgres_url: str) -> None:
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        assert await migrate(conn, target.schema, Migrations(QUEUE.component, QUEUE.steps[:7])) == 0
        schema = target.schema
        await conn.execute(_JOB.format(jobs=f"{schema}.jobs"))
        await conn.execute(_AUDIT.format(audit=f"{schema}.queue_audit"))
        await conn.execute(_SETTINGS.format(queues=f"{schema}.queues"))
    finally:
        await conn.close()
    assert QUEUE.version == 8
    async with await Queue.open(postgres_url, clock=lambda: T0) as queue:
        await check_migrated(queue)
