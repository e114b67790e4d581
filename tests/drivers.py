"""The one list of store drivers every store-parametrised test runs on: ``DRIVERS``, by name.

A ``Driver`` says how to make a fresh, empty store target for one test (a file in its ``tmp_path``; a schema of
its own in this run's PostgreSQL database) and drop it after, how to open each store of the port on it, the two
test factories (a state no port call makes, a failure inside a transaction), and the few facts where stores may
differ. The entries: ``sqlite``, ``postgresql``, and ``postgresql-pgbouncer`` (the same server in the mode the
README offers behind PgBouncer in transaction mode: ``?pooler=transaction``, woken by polling, no prepared-statement
cache).

``ASYNCQ_TEST_DRIVER=module:attribute`` names a ``Driver`` (or a list of them) defined outside the repository: it
is added to the registry (an entry of the same name is replaced), and every parametrised test runs on it too
(``tests/conformance/README.md``). A driver that needs a service names the fixtures that provide it
(``fixtures``): PostgreSQL's skip with the reason when the server does not answer, and fail under ``CI=true``.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from pgbouncer_support import running_bouncer, schema_alias
from postgres_support import SERVER_URL, fresh_schema, run_in_thread
from postgres_support import execute as pg_execute

from asyncq.store.opening import open_inbox_store, open_outbox_store, open_queue_store
from asyncq.store.port.inbox import InboxStore
from asyncq.store.port.outbox import OutboxStore
from asyncq.store.port.queue import Capabilities, QueueStore

#: Names a ``Driver`` (or a list of them) outside the repository: ``module:attribute``.
EXTERNAL = "ASYNCQ_TEST_DRIVER"


@dataclass(frozen=True)
class Driver:
    """What the store-parametrised tests need of a driver beyond the port."""

    name: str
    #: A fresh, empty store target (a path or URL) called ``name`` under the folder; everything made at it is
    #: dropped after the block. Two names in one test are two stores that do not share rows.
    target: Callable[[Path, str], AbstractAsyncContextManager[str]]
    #: Opens the queue store at a target, read-write or read-only (``open_queue(target, read_only)``).
    open_queue: Callable[[str, bool], Awaitable[QueueStore]]
    #: Opens the outbox store at a target (its tables created if missing).
    open_outbox: Callable[[str], Awaitable[OutboxStore]]
    #: Opens the inbox store at a target (its tables, and the effect's ``ddl``, created if missing).
    open_inbox: Callable[[str, Sequence[str]], Awaitable[InboxStore]]
    #: Opens the store a successful ``backup(target)`` wrote (drivers with ``capabilities.backup``).
    open_backup: Callable[[str], Awaitable[QueueStore]]
    #: Sets columns of one job directly: for states no port call can make (River's test factory does the same).
    force: Callable[[QueueStore, str, dict[str, Any]], None]
    #: Makes every later update of one job's row fail with "refused by the test" (a trigger): a failure in the
    #: middle of a call's transaction, after its other statements have run.
    refuse_updates_of: Callable[[QueueStore, str], None]
    #: Rows of one statement of the app's own (its tables, no parameters) on a connection of its own to a target.
    app_rows: Callable[[str, str], Awaitable[list[tuple[Any, ...]]]]
    #: What a fresh queue store of this driver says it can do.
    capabilities: Capabilities
    #: ``describe()["store"]``.
    kind: str
    #: Fixtures a test on this driver needs first (a server's: they skip, or fail under CI, when it is away).
    fixtures: tuple[str, ...] = ()

    @asynccontextmanager
    async def fresh(self, folder: Path) -> AsyncIterator[QueueStore]:
        """A fresh, empty queue store under ``folder``, at its default settings; closed and dropped after."""
        async with self.target(folder, "queue") as where:
            store = await self.open_queue(where, False)
            try:
                yield store
            finally:
                await store.close()

    async def open_another(self, store: QueueStore) -> QueueStore:
        """A second handle on the same store, as another process would open it (its own connection)."""
        return await self.open_queue(store.location, False)

    async def open_read_only(self, store: QueueStore) -> QueueStore:
        """A second, read-only handle on the same store."""
        return await self.open_queue(store.location, True)

    def prepare(self, request: pytest.FixtureRequest) -> Driver:
        """This driver, once the fixtures it needs are set up (or the test skipped): for a parametrised fixture."""
        for name in self.fixtures:
            request.getfixturevalue(name)
        return self


# -- SQLite ---------------------------------------------------------------------------------------------------


@asynccontextmanager
async def _sqlite_target(folder: Path, name: str) -> AsyncIterator[str]:
    yield str(folder / f"{name}.db")  # the folder is the test's tmp_path: pytest removes it


async def _sqlite_queue(target: str, read_only: bool) -> QueueStore:
    return await open_queue_store(target, durability="full", busy_timeout=5.0, read_only=read_only)


async def _sqlite_rows(target: str, statement: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(target, timeout=5)
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()


def _sqlite_force(store: QueueStore, job_id: str, columns: dict[str, Any]) -> None:
    assignments = ", ".join(f"{column} = :{column}" for column in columns)
    _sqlite_write(store, f"UPDATE asyncq_jobs SET {assignments} WHERE id = :id", {**columns, "id": job_id})


def _sqlite_refuse_updates_of(store: QueueStore, job_id: str) -> None:
    assert job_id.isidentifier(), job_id  # spliced into the trigger's text
    _sqlite_write(
        store,
        f"CREATE TRIGGER refuse_{job_id} BEFORE UPDATE ON asyncq_jobs WHEN OLD.id = '{job_id}' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        {},
    )


def _sqlite_write(store: QueueStore, statement: str, parameters: dict[str, Any]) -> None:
    """One statement on a connection of the test's own, committed before the store's next call."""
    con = sqlite3.connect(store.location, timeout=5, isolation_level=None)
    try:
        changed = con.execute(statement, parameters)
        assert changed.rowcount in (-1, 1), statement
    finally:
        con.close()


# -- PostgreSQL -----------------------------------------------------------------------------------------------


def _postgres_target(**options: str) -> Callable[[Path, str], AbstractAsyncContextManager[str]]:
    @asynccontextmanager
    async def target(folder: Path, name: str) -> AsyncIterator[str]:
        async with fresh_schema(**options) as (url, _schema):  # dropped after the block
            yield url

    return target


async def _postgres_rows(target: str, statement: str) -> list[tuple[Any, ...]]:
    import asyncpg

    from asyncq.store.postgres.connection import parse_url

    conn = await asyncpg.connect(parse_url(target).dsn, timeout=5)  # the URL's search_path: the app's tables
    try:
        return [tuple(row) for row in await conn.fetch(statement)]
    finally:
        await conn.close()


async def _postgres_queue(target: str, read_only: bool) -> QueueStore:
    return await open_queue_store(target, durability=None, busy_timeout=5.0, read_only=read_only)


async def _postgres_backup(target: str) -> QueueStore:
    raise AssertionError("a PostgreSQL store makes no backups of its own")


def _postgres_force(store: QueueStore, job_id: str, columns: dict[str, Any]) -> None:
    dsn, schema = _postgres_place(store)
    assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=2))
    statement = f"UPDATE {schema}.jobs SET {assignments} WHERE id = $1"
    done = run_in_thread(lambda: pg_execute(dsn, statement, job_id, *columns.values()))
    assert done == "UPDATE 1", (statement, done)


def _postgres_refuse_updates_of(store: QueueStore, job_id: str) -> None:
    assert job_id.isidentifier(), job_id  # spliced into the trigger's text
    dsn, schema = _postgres_place(store)
    function = f"""CREATE FUNCTION {schema}.refuse_{job_id}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refused by the test'; END $$"""
    trigger = (
        f"CREATE TRIGGER refuse_{job_id} BEFORE UPDATE ON {schema}.jobs FOR EACH ROW WHEN (OLD.id = '{job_id}')"
        f" EXECUTE FUNCTION {schema}.refuse_{job_id}()"
    )
    run_in_thread(lambda: pg_execute(dsn, function))
    run_in_thread(lambda: pg_execute(dsn, trigger))


def _postgres_place(store: QueueStore) -> tuple[str, str]:
    from asyncq.store.postgres.connection import parse_url

    target = parse_url(store.location)
    return target.dsn, target.schema


def _postgres(name: str, **options: str) -> Driver:
    return Driver(
        name=name,
        target=_postgres_target(**options),
        open_queue=_postgres_queue,
        open_outbox=lambda target: open_outbox_store(target, durability="full", busy_timeout=5.0),
        open_inbox=lambda target, ddl: open_inbox_store(target, ddl=ddl),
        app_rows=_postgres_rows,
        open_backup=_postgres_backup,
        force=_postgres_force,
        refuse_updates_of=_postgres_refuse_updates_of,
        capabilities=Capabilities(backup=False, app_sql=True, survives_power_loss=True, read_only=False),
        kind="postgresql",
        fixtures=("postgres_database",),
    )


SQLITE = Driver(
    name="sqlite",
    target=_sqlite_target,
    open_queue=_sqlite_queue,
    open_outbox=lambda target: open_outbox_store(target, durability="full", busy_timeout=5.0),
    open_inbox=lambda target, ddl: open_inbox_store(target, ddl=ddl),
    app_rows=_sqlite_rows,
    open_backup=lambda target: _sqlite_queue(target, False),
    force=_sqlite_force,
    refuse_updates_of=_sqlite_refuse_updates_of,
    capabilities=Capabilities(backup=True, app_sql=True, survives_power_loss=True, read_only=False),
    kind="sqlite",
)
POSTGRESQL = _postgres("postgresql")


def _bouncer_target(folder: Path, name: str) -> AbstractAsyncContextManager[str]:
    @asynccontextmanager
    async def target() -> AsyncIterator[str]:
        async with fresh_schema() as (url, schema):
            bouncer = running_bouncer(SERVER_URL)
            async with schema_alias(bouncer, url, schema) as alias:
                yield bouncer.url(alias, schema=schema, pooler="transaction")

    return target()


#: Through a real PgBouncer in transaction mode (``pgbouncer_support``), with the URL asyncq documents for it
#: (``?pooler=transaction``): no LISTEN (woken by polling) and no prepared-statement cache.
POSTGRESQL_PGBOUNCER = replace(
    _postgres("postgresql-pgbouncer"),
    target=_bouncer_target,
    fixtures=("postgres_database", "pgbouncer"),
)


def external(spec: str) -> list[Driver]:
    """The drivers ``module:attribute`` names (one ``Driver`` or an iterable of them); ``ValueError`` if not."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ValueError(f"{EXTERNAL} must be module:attribute, not {spec!r}")
    found = getattr(importlib.import_module(module), attribute)
    drivers = [found] if isinstance(found, Driver) else list(found) if isinstance(found, Iterable) else [found]
    wrong = [driver for driver in drivers if not isinstance(driver, Driver)]
    if wrong or not drivers:
        raise ValueError(f"{EXTERNAL}={spec} must name a Driver (tests/drivers.py) or a list of them, not {found!r}")
    return drivers


def registry(environ: Mapping[str, str] = os.environ) -> dict[str, Driver]:
    """Every driver by name: the repository's, plus (replacing one of the same name) those of ``EXTERNAL``."""
    drivers = {driver.name: driver for driver in (SQLITE, POSTGRESQL, POSTGRESQL_PGBOUNCER)}
    spec = environ.get(EXTERNAL, "").strip()
    for driver in external(spec) if spec else []:
        drivers[driver.name] = driver
    return drivers


DRIVERS = registry()
