"""The limits' schema versions (SQLite v14, PostgreSQL v11) from the version before (v13, v10: after tasks and
retention rules, schedules, dependencies and groups), with rows: jobs (their task and group kept), a queue's settings
and retention rule, and its audit are kept (the SQLite audit, rebuilt for its CHECK, keeps its seqs, every column of
version 13, ``task`` included, and still takes every move it took, ``retention_clear`` included; the next move goes on
from the highest seq); the new columns start empty (no limit, no limit key), and limits work at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from asyncq import Queue
from asyncq.core.flow_limits import Limits
from asyncq.store.postgres import schema as postgres_schema
from asyncq.store.postgres.connection import Migrations, migrate, parse_url
from asyncq.store.postgres.schema import QUEUE
from asyncq.store.sqlite import schema as sqlite_schema
from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
_JOB = (
    "INSERT INTO {jobs} (id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority,"
    " unique_key, task, group_name) VALUES ('old', 'mail', '{{}}', 'pending', 0, 3, 0, 0, 9999999999999, 4, 'k',"
    " 'send', 'g')"
)
_AUDIT = (
    "INSERT INTO {audit} (queue, action, at_ms, actor, note, max_wait_ms, retain_done_ms, task) VALUES"
    " ('mail', 'retention', 1, 'ops', 'a week', NULL, 604800000, NULL),"
    " ('mail', 'retention_clear', 2, 'ops', 'no rule for send', NULL, NULL, 'send')"
)
_SETTINGS = "INSERT INTO {queues} (queue, max_wait_ms) VALUES ('mail', 60000)"
_RULE = "INSERT INTO {rules} (queue, task, retain_done_ms) VALUES ('mail', '', 604800000)"


async def check_migrated(queue: Queue) -> None:
    job = await queue.get("old")
    assert job is not None
    assert (job.priority, job.unique_key, job.task, job.group, job.limit_key) == (4, "k", "send", "g", None)
    cleared, old = await queue.queue_audit("mail")
    assert (old.seq, old.action, old.retain_done_ms, old.task) == (1, "retention", 604_800_000, None)
    assert old.limits == Limits()
    assert (cleared.seq, cleared.action, cleared.task, cleared.limits) == (2, "retention_clear", "send", Limits())
    [settings] = await queue.queue_settings()
    assert (settings.max_wait_ms, settings.retain_done_ms, settings.limits) == (60_000, 604_800_000, Limits())
    entry = await queue.set_limits("mail", concurrency=1)
    assert entry.seq == 3 and entry.limits == Limits(concurrency=1) and entry.task is None
    ruled = await queue.set_retention("mail", task="send", done=60)  # the rebuilt audit takes every move
    assert (ruled.seq, ruled.action, ruled.task) == (4, "retention", "send")
    assert await queue.enqueue("new", {}, queue="mail", limit_key="tenant") is True
    assert [ticket.id for ticket in await queue.claim("w1", queue="mail", limit=5)] == ["old"]  # one slot


async def test_a_sqlite_version_13_file_gets_the_limits_with_its_rows(tmp_path: Path) -> None:
    assert MIGRATIONS[13] is sqlite_schema.LIMITS  # version 14
    path = tmp_path / "v13.db"
    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:13]:
        for statement in step:
            if isinstance(statement, str):
                con.execute(statement)
            else:
                statement(con)
    con.execute(_JOB.format(jobs="asyncq_jobs"))
    con.execute(_AUDIT.format(audit="asyncq_queue_audit"))
    con.execute(_SETTINGS.format(queues="asyncq_queues"))
    con.execute(_RULE.format(rules="asyncq_retention"))
    con.execute("PRAGMA user_version = 13")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        await check_migrated(queue)
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        con.close()


async def test_a_postgresql_version_10_schema_gets_the_limits_with_its_rows(postgres_url: str) -> None:
    assert QUEUE.steps[10] is postgres_schema.LIMITS  # version 11
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        assert await migrate(conn, target.schema, Migrations(QUEUE.component, QUEUE.steps[:10])) == 0
        schema = target.schema
        await conn.execute(_JOB.format(jobs=f"{schema}.jobs"))
        await conn.execute(_AUDIT.format(audit=f"{schema}.queue_audit"))
        await conn.execute(_SETTINGS.format(queues=f"{schema}.queues"))
        await conn.execute(_RULE.format(rules=f"{schema}.retention"))
    finally:
        await conn.close()
    async with await Queue.open(postgres_url, clock=lambda: T0) as queue:
        await check_migrated(queue)
