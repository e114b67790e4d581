"""The SQLite driver's file: schema version and forward migration, durability settings (journal mode and
synchronous level), and ``enqueue_sync`` inside an app's own ``sqlite3`` transaction. Moved from
``tests/test_queue.py``: what is SQLite's alone, beside the conformance suite that every driver passes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import T0

from asyncq.core.retention import RetentionRule, Windows
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.store.sqlite.sync import enqueue_sync

from .sqlite_files import read, snapshot

pytestmark = pytest.mark.timeout(20)


# --- the file: schema version and durability -----------------------------------------------------------


async def test_schema_version_is_in_user_version_and_reopen_is_idempotent(path: Path, clock: list[int]) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {"v": 1})
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    schema = read(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    rows = snapshot(path)
    for _ in range(2):
        async with await Queue.open(path, clock=lambda: clock[0]) as queue:
            assert (await queue.get("job")) is not None
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert read(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert snapshot(path) == rows


async def test_a_file_with_a_newer_schema_version_is_refused(path: Path) -> None:
    async with await Queue.open(path) as queue:
        await queue.enqueue("job", {})
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    rows = snapshot(path)
    with pytest.raises(ValueError, match="newer"):
        await Queue.open(path)
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION + 1,)]
    assert snapshot(path) == rows


async def test_open_refuses_an_unknown_durability_and_a_memory_database(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await Queue.open(tmp_path / "q.db", durability="fast")
    assert not (tmp_path / "q.db").exists()
    with pytest.raises(ValueError):
        await Queue.open(":memory:")


SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@pytest.mark.parametrize(
    ("durability", "journal_mode", "synchronous"),
    [("full", "wal", "FULL"), ("full-delete", "delete", "EXTRA"), ("normal", "wal", "NORMAL")],
)
async def test_durability_modes_set_journal_mode_and_synchronous(
    path: Path, durability: str, journal_mode: str, synchronous: str
) -> None:
    async with await Queue.open(path, durability=durability) as queue:
        assert (await queue.describe())["durability"] == durability
        await queue.enqueue("job", {})
        # The journal mode of a file is what an independent connection finds (WAL persists in the file;
        # DELETE is what a fresh connection gets on a file that is not in WAL).
        assert read(path, "PRAGMA journal_mode") == [(journal_mode,)]
        # synchronous belongs to the connection: read it back through the queue's own connection.
        async with queue.transaction() as tx:
            [(level,)] = await tx.execute("PRAGMA synchronous")
            [(mode,)] = await tx.execute("PRAGMA journal_mode")
        assert SYNCHRONOUS[level] == synchronous
        assert mode == journal_mode


async def test_reopening_with_another_durability_switches_the_journal_mode(path: Path) -> None:
    async with await Queue.open(path, durability="full") as queue:
        await queue.enqueue("job", {})
    assert read(path, "PRAGMA journal_mode") == [("wal",)]
    async with await Queue.open(path, durability="full-delete") as queue:
        assert (await queue.get("job")) is not None
    assert read(path, "PRAGMA journal_mode") == [("delete",)]


async def test_a_version_1_file_is_migrated_forward_with_its_jobs(path: Path) -> None:
    """A file made by schema version 1 (its full indexes) opens as the current version, rows kept, and its
    lifecycle statements then seek the partial indexes."""
    from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION

    con = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:
        con.execute(statement)
    con.execute(
        "INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
        " deadline) VALUES ('old', 'default', '{}', 'pending', 0, 3, 0, 0, 9999999999999)"
    )
    con.execute("PRAGMA user_version = 1")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        [ticket] = await queue.claim("w1")
        assert ticket.id == "old"
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) and SCHEMA_VERSION >= 14
        indexes = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "asyncq_jobs_ready" not in indexes and "asyncq_jobs_pending" not in indexes  # v8: ranked instead
        assert {"asyncq_jobs_ranked", "asyncq_jobs_prioritised"} <= indexes  # v16: no waiting, no ready_at index
        assert "asyncq_jobs_waiting" not in indexes and "asyncq_jobs_ready_at" not in indexes
    finally:
        con.close()


async def test_a_version_8_file_keeps_its_queue_audit_through_the_retention_migration(path: Path) -> None:
    """Version 9 rebuilds the queue audit (its action check gains ``retention``): the rows and their seqs stay, and
    the next move's seq goes on from the highest."""
    from asyncq.store.sqlite.migrations import MIGRATIONS

    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:8]:
        for statement in step:
            con.execute(statement)
    con.execute(
        "INSERT INTO asyncq_queue_audit (queue, action, at_ms, actor, note, max_wait_ms)"
        " VALUES ('mail', 'max_wait', 1, 'ops', 'bound it', 60000)"
    )
    con.execute("INSERT INTO asyncq_queues (queue, max_wait_ms) VALUES ('mail', 60000)")
    con.execute("PRAGMA user_version = 8")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        [old] = await queue.queue_audit("mail")
        assert (old.seq, old.action, old.max_wait_ms, old.retention) == (1, "max_wait", 60000, (None, None, None))
        entry = await queue.set_retention("mail", done=60)
        assert entry.seq == 2 and entry.retention == (60_000, None, None)
        [settings] = await queue.queue_settings()
        assert (settings.max_wait_ms, settings.retain_done_ms) == (60000, 60_000)
        assert await queue.retention_rules() == [RetentionRule("mail", None, Windows(60_000))]


async def test_a_version_10_file_gains_tasks_and_retention_rules_with_its_rows_kept(path: Path) -> None:
    """Version 11 adds ``task`` (and its index) without reading any body: a row stored before has none, and the
    same id and body again is still the same job (the column is not compared); new task jobs get theirs. A queue
    that set its retention keeps its windows as its rule (also one that set them all for ever); one that never did
    (only paused) gets none; the queue audit keeps its rows and seqs; the ended jobs' index is replaced."""
    from asyncq.store.sqlite.migrations import MIGRATIONS

    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:10]:
        for statement in step:
            con.execute(statement)
    con.execute(
        "INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at, deadline)"
        """ VALUES ('old', 'default', '{"args":{},"task":"send"}', 'done', 1, 3, 1, 0, 9999999999999)"""
    )
    con.execute("INSERT INTO asyncq_queues (queue, retain_done_ms, retain_dead_ms) VALUES ('mail', 60000, 0)")
    con.execute("INSERT INTO asyncq_queues (queue) VALUES ('kept')")
    con.execute("INSERT INTO asyncq_queues (queue, paused_at, paused_by, note) VALUES ('held', 5, 'ops', 'wait')")
    for queue in ("mail", "kept"):
        con.execute(
            "INSERT INTO asyncq_queue_audit (queue, action, at_ms, actor, note) VALUES (?, 'retention', 1, 'ops', 'n')",
            (queue,),
        )
    con.execute(
        "INSERT INTO asyncq_queue_audit (queue, action, at_ms, actor, note) VALUES ('held', 'pause', 5, 'ops', 'wait')"
    )
    con.execute("PRAGMA user_version = 10")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        old = await queue.get("old")
        assert old is not None and (old.status, old.task) == ("done", None)
        assert await queue.enqueue("old", {"task": "send", "args": {}}) is False
        assert await queue.enqueue("new", {"task": "send", "args": {}}) is True
        new = await queue.get("new")
        assert new is not None and new.task == "send"
        assert await queue.retention_rules() == [
            RetentionRule("kept", None, Windows()),
            RetentionRule("mail", None, Windows(60_000, 0, None)),
        ]
        assert [(s.queue, s.paused_by, s.retain_done_ms) for s in await queue.queue_settings()] == [
            ("held", "ops", None),
            ("kept", None, None),
            ("mail", None, 60_000),
        ]
        assert [(m.seq, m.queue, m.action, m.task) for m in await queue.queue_audit()] == [
            (3, "held", "pause", None),
            (2, "kept", "retention", None),
            (1, "mail", "retention", None),
        ]
        entry = await queue.set_retention("mail", task="send", done=1)
        assert (entry.seq, entry.task) == (4, "send")
    indexes = {name for (name,) in read(path, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"asyncq_jobs_task", "asyncq_jobs_retained"} <= indexes and "asyncq_jobs_ended" not in indexes


async def test_a_version_11_file_with_jobs_and_queue_settings_gains_the_schedule_tables(path: Path) -> None:
    """Version 12 adds the schedules and their events beside the rows of version 11, which stay as they were."""
    from asyncq.core.schedules import ScheduleSpec
    from asyncq.store.sqlite.migrations import MIGRATIONS

    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:11]:
        for statement in step:
            con.execute(statement)
    con.execute(
        "INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at, deadline)"
        " VALUES ('old', 'default', '{}', 'pending', 0, 3, 0, 0, 9999999999999)"
    )
    con.execute("INSERT INTO asyncq_queues (queue, max_wait_ms) VALUES ('default', 60000)")
    con.execute("PRAGMA user_version = 11")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        assert (await queue.get("old")) is not None and (await queue.queue_settings())[0].max_wait_ms == 60000
        assert await queue.schedules() == []
        [event] = await queue.declare_schedules([ScheduleSpec("beat", {}, every=10)])
        assert (event.seq, event.kind) == (1, "declared")
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# --- enqueue_sync: the caller's own sqlite3 transaction ----------------------------------------------------


def app_connection(path: Path) -> sqlite3.Connection:
    """An application's connection in Python's default (legacy) transaction mode."""
    con = sqlite3.connect(path, timeout=5)
    assert con.isolation_level is not None  # implicit BEGIN before DML; the app calls commit() or rollback()
    con.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    return con


@pytest.mark.parametrize("queue_file_exists", [True, False])
async def test_enqueue_sync_rolls_back_and_commits_with_the_callers_transaction(
    path: Path, queue_file_exists: bool
) -> None:
    if queue_file_exists:
        await (await Queue.open(path)).close()
    con = app_connection(path)
    try:
        con.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))  # opens the implicit transaction
        assert con.in_transaction
        assert enqueue_sync(con, "mail-o1", {"order": "o1"}) is True
        assert con.in_transaction  # joined the caller's transaction, did not commit it
        con.rollback()
        assert read(path, "SELECT * FROM orders") == []
        if queue_file_exists:
            assert read(path, "SELECT * FROM asyncq_jobs") == []
        else:  # the tables enqueue_sync created in the caller's transaction rolled back with it
            assert read(path, "SELECT name FROM sqlite_master WHERE name LIKE 'asyncq%'") == []
            assert read(path, "PRAGMA user_version") == [(0,)]

        con.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))
        assert enqueue_sync(con, "mail-o1", {"order": "o1"}) is True
        assert read(path, "SELECT * FROM orders") == []  # nothing visible before the caller commits
        con.commit()
    finally:
        con.close()
    assert read(path, "SELECT * FROM orders") == [("o1", 100)]
    assert read(path, "SELECT id, status FROM asyncq_jobs") == [("mail-o1", "pending")]
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    async with await Queue.open(path) as queue:
        [ticket] = await queue.claim("w1")
        assert ticket.body == {"order": "o1"}


async def test_enqueue_sync_without_an_open_transaction_commits_its_own(path: Path) -> None:
    con = app_connection(path)
    try:
        con.commit()
        assert enqueue_sync(con, "job", [1], now_ms=T0) is True
        assert not con.in_transaction
        assert enqueue_sync(con, "job", [1], now_ms=T0 + 1) is False
        with pytest.raises(Conflict):
            enqueue_sync(con, "job", [2], now_ms=T0)
        with pytest.raises(ValueError):
            enqueue_sync(con, "job", [1], max_attempts=True)
        assert not con.in_transaction
    finally:
        con.close()
    assert read(path, "SELECT id, available_at FROM asyncq_jobs") == [("job", T0)]
