"""Where an outbox test's stores live, on every driver of the registry (``tests/drivers.py``): the ``place``
fixture gives each test two fresh store targets, one for the app's outbox and one for the receiver's inbox (two
SQLite files in its ``tmp_path``, or two schemas of this run's PostgreSQL database dropped after it).

asyncq's own rows are read through the port (``Place.items``, ``Place.figures``: ``OutboxStore.get`` and
``figures``); the port itself is tested on every driver in ``tests/conformance/test_outbox_port.py`` and
``test_inbox_port.py``. What the port does not show (the app's tables, a whole store's tables, whether a
transaction is left open, the inbox's insertion order) is read here with statements written for each dialect.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from drivers import DRIVERS, Driver

from asyncq.store.port.outbox import Figures, Item, OutboxStore

#: asyncq's messaging tables, by their name in a PostgreSQL schema: the name the same table has on SQLite.
SQLITE_NAMES = {
    "outbox": "asyncq_outbox",
    "outbox_lease": "asyncq_outbox_lease",
    "outbox_audit": "asyncq_outbox_audit",
    "inbox": "asyncq_inbox",
}


@dataclass(frozen=True)
class Place:
    """The test's outbox and inbox: paths (SQLite) or URLs (PostgreSQL), their driver, and how to read them."""

    driver: Driver
    outbox: str
    inbox: str

    @property
    def dialect(self) -> str:
        """The SQL the stores speak (``EffectTransaction.dialect``): ``sqlite`` or ``postgresql``."""
        return self.driver.kind

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgresql"

    @asynccontextmanager
    async def outbox_store(self) -> AsyncIterator[OutboxStore]:
        """The outbox's store opened on a handle of the test's own, closed after the block."""
        store = await self.driver.open_outbox(self.outbox)
        try:
            yield store
        finally:
            await store.close()

    async def items(self, ids: Iterable[str]) -> list[Item]:
        """The stored items of these ids that exist, in ``seq`` order (``OutboxStore.get``)."""
        async with self.outbox_store() as store:
            found = [await store.get(item_id) for item_id in ids]
        return sorted((item for item in found if item is not None), key=lambda item: item.seq)

    async def figures(self, now_ms: int = 0) -> Figures:
        """The outbox's figures (``OutboxStore.figures``): its counts, head and lease."""
        async with self.outbox_store() as store:
            return await store.figures(now_ms)

    async def app_rows(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        """The rows of one statement of the app's own (no parameters) on a connection of its own to ``target``."""
        return await self.driver.app_rows(target, statement)

    async def inbox_ids_in_insertion_order(self) -> list[str]:
        """The inbox's ids in the order their transactions inserted them (rows never updated since: on PostgreSQL
        the inserting transaction's id)."""
        if self.postgres:
            statement = f"SELECT id FROM {self._schema(self.inbox)}.inbox ORDER BY xmin::text::bigint"
        else:
            statement = "SELECT id FROM asyncq_inbox ORDER BY rowid"
        return [item_id for (item_id,) in await self.app_rows(self.inbox, statement)]

    async def has_table(self, target: str, name: str) -> bool:
        """Whether the app's table ``name`` exists in ``target`` (for PostgreSQL: in its schema)."""
        assert name.isidentifier(), name  # spliced into the statement
        if self.postgres:
            [(found,)] = await self.app_rows(target, f"SELECT to_regclass('{name}') IS NOT NULL")
            return bool(found)
        return bool(await self.app_rows(target, f"SELECT name FROM sqlite_master WHERE name = '{name}'"))

    async def tables(self, target: str) -> dict[str, list[tuple[Any, ...]]]:
        """Every table's rows (sorted), asyncq's by their SQLite name: a whole store's state, to compare before and
        after."""
        if self.postgres:
            schema = self._schema(target)
            names = await self.app_rows(target, f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")
            found = {name: await self.app_rows(target, f"SELECT * FROM {schema}.{name}") for (name,) in names}
            return {SQLITE_NAMES.get(name, name): sorted(rows) for name, rows in sorted(found.items())}
        tables = await self.app_rows(target, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return {name: sorted(await self.app_rows(target, f"SELECT * FROM {name}")) for (name,) in tables}

    async def in_no_transaction(self, target: str) -> bool:
        """Whether no connection holds a transaction open on ``target`` (SQLite: its write lock is free; PostgreSQL:
        no asyncq connection to this database is idle inside a transaction)."""
        if not self.postgres:
            return not write_lock_is_held(Path(target))
        [(count,)] = await self.app_rows(
            target,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'asyncq'"
            " AND state LIKE 'idle in transaction%'",
        )
        return bool(count == 0)

    @staticmethod
    def _schema(target: str) -> str:
        from asyncq.store.postgres.connection import parse_url

        return parse_url(target).schema  # checked by parse_url: safe to splice


def write_lock_is_held(db: Path) -> bool:
    """Whether another connection holds the file's write lock (a ``BEGIN IMMEDIATE`` that may not wait fails)."""
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as error:
        assert "locked" in str(error)
        return True
    finally:
        other.close()


@pytest.fixture(params=sorted(DRIVERS))
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    """Each driver of the registry in turn: two files in ``tmp_path``, or two fresh schemas (skipped with the reason
    when the PostgreSQL server does not answer, a failure under ``CI=true``)."""
    driver = DRIVERS[request.param].prepare(request)
    async with AsyncExitStack() as stack:
        outbox = await stack.enter_async_context(driver.target(tmp_path, "app"))
        inbox = await stack.enter_async_context(driver.target(tmp_path, "sink"))
        yield Place(driver, outbox, inbox)
