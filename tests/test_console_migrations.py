"""The console's schema versions (``CONSOLE``, the last step on both stores) migrate a queue of the version before
with its rows: its
jobs, errors and audit rows kept (``op_seq`` empty on the old rows), the operator audit, samples and workers tables
added, the job audit taking the console's moves, and a console action working at once. And the console's benchmark
smoke run on both stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from asyncq import Queue
from asyncq.core.jobs import JobSpec
from asyncq.core.operations import ADMIN, AuditQuery, Operation
from asyncq.core.search import JobQuery
from asyncq.queue.console import OperatorConsole

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000


async def old_rows(queue: Queue) -> None:
    """One job done, one dead, redriven once, then dead again."""
    await queue.enqueue_many([JobSpec("ok", {}), JobSpec("bad", {"n": 1}, max_attempts=1)])
    for ticket in await queue.claim("w1", limit=2):
        await queue.finish(ticket, "ok" if ticket.id == "ok" else "permanent")
    await queue.redrive("bad", "try-again")
    [ticket] = await queue.claim("w1")
    await queue.finish(ticket, "permanent")


async def check_migrated(queue: Queue) -> None:
    [redrive] = await queue.history("bad")
    assert (redrive.action, redrive.note, redrive.op_seq) == ("redrive", "try-again", None)
    console = OperatorConsole(queue)
    preview = await console.preview("delete", JobQuery(ids=("bad",)))
    op = Operation("delete", 1, preview.digest, "ada", ADMIN, "cleanup", JobQuery(ids=("bad",)))
    entry = await console.operate(op)
    assert await queue.get("bad") is None
    moves = [(row.action, row.op_seq) for row in await queue.history("bad")]
    assert moves == [("redrive", None), ("delete", entry.seq)]
    assert (await console.audit(AuditQuery()))[0] == [entry]


async def test_a_sqlite_file_of_the_version_before_migrates_to_the_console_version(tmp_path: Path) -> None:
    from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION
    from asyncq.store.sqlite.schema import CONSOLE, OFFERS, PENDING_BY_TIME

    assert MIGRATIONS[-3:] == (CONSOLE, PENDING_BY_TIME, OFFERS)  # the hand-undo below undoes these versions only

    path = tmp_path / "queue.db"
    async with await Queue.open(path, clock=lambda: T0) as queue:
        await old_rows(queue)
    con = sqlite3.connect(path, isolation_level=None)
    try:  # back to the version before the console's: versions 17 and 16, then the console's block, undone by hand
        con.execute("DROP TABLE asyncq_offers")
        con.execute("DROP TABLE asyncq_offered")
        con.execute("DROP INDEX asyncq_jobs_prioritised")
        con.execute("CREATE INDEX asyncq_jobs_waiting ON asyncq_jobs(queue, available_at) WHERE status = 'pending'")
        con.execute("CREATE INDEX asyncq_jobs_ready_at ON asyncq_jobs(available_at + 0) WHERE status = 'pending'")
        con.execute("DROP TABLE asyncq_operations")
        con.execute("DROP TABLE asyncq_samples")
        con.execute("DROP TABLE asyncq_workers_seen")
        con.execute("DROP INDEX asyncq_errors_type")
        con.execute("ALTER TABLE asyncq_audit DROP COLUMN op_seq")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 3}")
    finally:
        con.close()
    async with await Queue.open(path, clock=lambda: T0 + 1) as queue:
        await check_migrated(queue)
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        indexes = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "asyncq_errors_type" in indexes
    finally:
        con.close()


@pytest.mark.usefixtures("postgres_database")
async def test_a_version_7_postgresql_schema_migrates_through_the_console_version(postgres_url: str) -> None:
    import asyncpg

    from asyncq.store.postgres.connection import Migrations, migrate, parse_url
    from asyncq.store.postgres.schema import QUEUE, SCHEMA_VERSION

    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn)
    try:
        await migrate(conn, target.schema, Migrations("queue", QUEUE.steps[:7]))
        await conn.execute(
            f"INSERT INTO {target.schema}.jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
            " deadline, reason) VALUES ('bad', 'default', '{}', 'dead', 1, 1, 2, $1, $2, 'permanent')",
            T0,
            T0 + 86_400_000,
        )
        seq = await conn.fetchval(f"SELECT seq FROM {target.schema}.jobs WHERE id = 'bad'")
        await conn.execute(
            f"INSERT INTO {target.schema}.audit (id, job_seq, token, at_ms, note, action) VALUES"
            " ('bad', $1, 1, $2, 'try-again', 'redrive')",
            seq,
            T0,
        )
    finally:
        await conn.close()
    async with await Queue.open(postgres_url, clock=lambda: T0 + 1) as queue:
        await check_migrated(queue)
        assert (await queue.describe())["schema_version"] == SCHEMA_VERSION


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("postgres_database")
def test_the_console_benchmark_runs_quick_on_both_stores_and_writes_no_docs(tmp_path: Path) -> None:
    import hashlib
    import os
    import subprocess
    import sys

    from postgres_support import run_database

    root = Path(__file__).resolve().parents[1]
    docs = root / "docs" / "benchmarks.md"
    before = hashlib.sha256(docs.read_bytes()).hexdigest()
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "console_search.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root), "ASYNCQ_BENCH_POSTGRES": run_database()},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the console's reads at depth" in done.stdout and " met" in done.stdout
    assert hashlib.sha256(docs.read_bytes()).hexdigest() == before
