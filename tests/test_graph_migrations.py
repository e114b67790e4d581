"""The dependencies-and-groups migration from the version before it, with rows (SQLite v12 -> v13, PostgreSQL v9 ->
v10): every row kept whole, the status check takes ``waiting`` (and still refuses anything else), a waiting job holds
its unique key, and a graph works on the migrated store. On SQLite the status check is widened in place: a
connection opened before the migration reads the new schema at its next statement."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from asyncq.queue import Queue
from asyncq.store.postgres.connection import Migrations, migrate, parse_url
from asyncq.store.postgres.graph_schema import GRAPHS
from asyncq.store.postgres.schema import QUEUE
from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
COLUMNS = "id, queue, body, status, attempts, max_attempts, token, available_at, deadline, owner, lease_until, reason"
ROWS = [  # one job of each status, the pending one holding a unique key
    ("p", "default", "{}", "pending", 0, 3, 0, T0, T0 + 86_400_000, None, None, None),
    ("l", "default", "{}", "leased", 1, 3, 1, T0, T0 + 86_400_000, "w1", T0 + 30_000, None),
    ("d", "default", "{}", "done", 1, 3, 1, T0, T0 + 86_400_000, None, None, None),
    ("x", "default", "{}", "dead", 1, 1, 1, T0, T0 + 86_400_000, None, None, "permanent"),
]


def sqlite_v12(path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        for step in MIGRATIONS[:12]:
            for statement in step:
                assert isinstance(statement, str)
                con.execute(statement)
        con.executemany(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES ({', '.join('?' * 12)})", ROWS)
        con.execute("UPDATE asyncq_jobs SET unique_key = 'k' WHERE id = 'p'")
        con.execute("PRAGMA user_version = 12")
    finally:
        con.close()


async def check_migrated(target: str, stored: dict[str, tuple[object, ...]]) -> None:
    async with await Queue.open(target, clock=lambda: T0 + 1) as queue:
        jobs = {job.id: job for job in await queue.list_jobs(limit=100)}
        found = {job_id: (j.status, j.attempts, j.reason, j.unique_key, j.waits, j.group) for job_id, j in jobs.items()}
        assert found == {
            job_id: (row[3], row[4], row[11], "k" if job_id == "p" else None, 0, None) for job_id, row in stored.items()
        }
        assert await queue.enqueue("twin", {}, unique_key="k") == "p"
        await queue.enqueue("w", {}, after=["l"], unique_key="w-key", group="g")
        assert await queue.enqueue("w-twin", {}, unique_key="w-key") == "w"  # a waiting job holds its key
        [ticket] = await queue.claim("w2", lease=60)
        assert ticket.id == "p"
        job = await queue.get("w")
        assert job is not None and (job.status, job.waits, job.group) == ("waiting", 1, "g")
        assert (await queue.stats()).by_status["waiting"] == 1


async def test_sqlite_v12_file_migrates_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    sqlite_v12(path)
    early = sqlite3.connect(path, isolation_level=None)  # opened before the migration: it must see the new check
    try:
        assert early.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (4,)
        await check_migrated(str(path), {row[0]: row for row in ROWS})
        early.execute(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES ('e', 'q', '{{}}', 'waiting', 0, 3, 0, 0, 1, NULL,"
                      " NULL, NULL)")  # fmt: skip
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            early.execute(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES ('b', 'q', '{{}}', 'bogus', 0, 3, 0, 0, 1,"
                          " NULL, NULL, NULL)")  # fmt: skip
        assert early.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert early.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)  # v13 and every version after
    finally:
        early.close()


async def test_postgresql_v9_schema_migrates_with_its_rows(postgres_url: str) -> None:
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn)
    try:
        await migrate(conn, target.schema, Migrations(component="queue", steps=QUEUE.steps[:9]))
        for row in ROWS:
            await conn.execute(
                f"INSERT INTO {target.schema}.jobs ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
                " $12)",
                *row,
            )
        await conn.execute(f"UPDATE {target.schema}.jobs SET unique_key = 'k' WHERE id = 'p'")
        await check_migrated(postgres_url, {row[0]: row for row in ROWS})
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(f"UPDATE {target.schema}.jobs SET status = 'bogus' WHERE id = 'p'")
        version = await conn.fetchval(f"SELECT version FROM {target.schema}.versions WHERE component = 'queue'")
        assert version == QUEUE.version and QUEUE.steps[9] is GRAPHS  # version 10, then every version after
    finally:
        await conn.close()
