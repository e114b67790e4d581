"""Where an outbox test's stores live, on either driver: the ``place`` fixture gives two SQLite files in the test's
``tmp_path``, or two fresh schemas of this run's PostgreSQL database (dropped after the test), one for the app's
outbox and one for the receiver's inbox.

Tests read the stores through connections of their own (``Place.rows``), with statements written once as on
SQLite: asyncq's tables by their SQLite names (``asyncq_outbox``, ``asyncq_outbox_lease``, ``asyncq_outbox_audit``,
``asyncq_inbox``) and ``?`` parameters; on PostgreSQL the names become the schema's tables (``<schema>.outbox``…)
and the parameters ``$1``, ``$2``…. An app's own statements go through ``Place.sql`` the same way (the URLs set the
``search_path`` to the schema, so the app's unqualified tables live there and go with it).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from drivers import DRIVERS, Driver

_TABLES = re.compile(r"\basyncq_(outbox_lease|outbox_audit|outbox|inbox)\b")


def numbered(statement: str) -> str:
    """``statement`` with its ``?`` parameters as PostgreSQL's ``$1``, ``$2``… (the tests' statements hold no other
    question mark)."""
    count = iter(range(1, statement.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(count)}", statement)


def on_postgres(statement: str, schema: str) -> str:
    """A statement written as on SQLite (asyncq's table names, ``?`` parameters) for the store in ``schema``."""
    return _TABLES.sub(lambda match: f"{schema}.{match.group(1)}", numbered(statement))


@dataclass(frozen=True)
class Place:
    """The test's outbox and inbox: paths (SQLite) or URLs (PostgreSQL), and how to read them."""

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

    @property
    def insertion_order(self) -> str:
        """An ``ORDER BY`` key of a table's rows in the order their transactions inserted them (rows never updated
        since: on PostgreSQL the inserting transaction's id)."""
        return "xmin::text::bigint" if self.postgres else "rowid"

    async def has_table(self, target: str, name: str) -> bool:
        """Whether the app's table ``name`` exists in ``target`` (for PostgreSQL: in its schema)."""
        if self.postgres:
            [(found,)] = await self.rows(target, "SELECT to_regclass(?::text) IS NOT NULL", name)
            return bool(found)
        return bool(await self.rows(target, "SELECT name FROM sqlite_master WHERE name = ?", name))

    async def tables(self, target: str) -> dict[str, list[tuple[Any, ...]]]:
        """Every table's rows (sorted), by its SQLite name: a whole store's state, to compare before and after."""
        if self.postgres:
            from asyncq.store.postgres.connection import parse_url

            schema = parse_url(target).schema
            names = await self.rows(target, "SELECT tablename FROM pg_tables WHERE schemaname = ?", schema)
            found = {name: await self.rows(target, f"SELECT * FROM {schema}.{name}") for (name,) in names}
            return {_sqlite_name(name): sorted(rows) for name, rows in sorted(found.items())}
        tables = await self.rows(target, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return {name: sorted(await self.rows(target, f"SELECT * FROM {name}")) for (name,) in tables}

    async def in_no_transaction(self, target: str) -> bool:
        """Whether no connection holds a transaction open on ``target`` (SQLite: its write lock is free; PostgreSQL:
        no asyncq connection to this database is idle inside a transaction)."""
        if not self.postgres:
            return not write_lock_is_held(Path(target))
        [(count,)] = await self.rows(
            target,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'asyncq'"
            " AND state LIKE 'idle in transaction%'",
        )
        return bool(count == 0)

    def sql(self, statement: str) -> str:
        """An app's statement written with ``?`` parameters, in this store's dialect."""
        return numbered(statement) if self.postgres else statement

    async def rows(self, target: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        """``statement`` (SQLite's table names and parameters) on a connection of its own to ``target``."""
        if not self.postgres:
            con = sqlite3.connect(target)
            try:
                return con.execute(statement, args).fetchall()
            finally:
                con.close()
        import asyncpg

        from asyncq.store.postgres.connection import parse_url

        found = parse_url(target)
        conn = await asyncpg.connect(found.dsn)
        try:
            return [tuple(row) for row in await conn.fetch(on_postgres(statement, found.schema), *args)]
        finally:
            await conn.close()


def _sqlite_name(name: str) -> str:
    return f"asyncq_{name}" if _TABLES.fullmatch(f"asyncq_{name}") else name


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
