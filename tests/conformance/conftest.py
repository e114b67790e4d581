"""The store conformance suite's fixtures: ``store`` is a fresh, empty queue store of each driver in ``DRIVERS``,
opened in the test's ``tmp_path`` and closed after it.

A driver is one entry of ``DRIVERS`` (a ``support.Driver``): how to open a fresh store and more handles on it,
two test factories (a state no port call makes, a failure inside a transaction), and the few facts where stores
may differ (capabilities, the kind ``describe`` names). Every test takes ``store`` (and ``driver`` for those facts)
and runs unchanged on each (the model: River's ``riverdrivertest.Exercise``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from postgres_support import execute as pg_execute
from postgres_support import fresh_schema, run_in_thread

from asyncq.store.port.queue import Capabilities, QueueStore
from asyncq.store.sqlite.queue_store import SqliteQueueStore

from .support import Driver


@asynccontextmanager
async def _sqlite_fresh(folder: Path) -> AsyncIterator[QueueStore]:
    store = await SqliteQueueStore.open(folder / "queue.db")
    try:
        yield store
    finally:
        await store.close()  # the folder is the test's tmp_path: pytest removes it


async def _sqlite_another(store: QueueStore) -> QueueStore:
    return await SqliteQueueStore.open(store.location)


async def _sqlite_read_only(store: QueueStore) -> QueueStore:
    return await SqliteQueueStore.open(store.location, read_only=True)


async def _sqlite_backup(target: str) -> QueueStore:
    return await SqliteQueueStore.open(target)


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


@asynccontextmanager
async def _postgres_fresh(folder: Path) -> AsyncIterator[QueueStore]:
    from asyncq.store.postgres.queue_store import PostgresQueueStore

    async with fresh_schema() as (url, _schema):  # dropped after the test
        store = await PostgresQueueStore.open(url)
        try:
            yield store
        finally:
            await store.close()


async def _postgres_another(store: QueueStore) -> QueueStore:
    from asyncq.store.postgres.queue_store import PostgresQueueStore

    return await PostgresQueueStore.open(store.location)


async def _postgres_read_only(store: QueueStore) -> QueueStore:
    from asyncq.store.postgres.queue_store import PostgresQueueStore

    return await PostgresQueueStore.open(store.location, read_only=True)


async def _postgres_backup(target: str) -> QueueStore:
    raise AssertionError("a PostgreSQL store makes no backups of its own")


def _postgres_force(store: QueueStore, job_id: str, columns: dict[str, Any]) -> None:
    dsn, schema = _postgres_target(store)
    assignments = ", ".join(f"{column} = ${n}" for n, column in enumerate(columns, start=2))
    statement = f"UPDATE {schema}.jobs SET {assignments} WHERE id = $1"
    done = run_in_thread(lambda: pg_execute(dsn, statement, job_id, *columns.values()))
    assert done == "UPDATE 1", (statement, done)


def _postgres_refuse_updates_of(store: QueueStore, job_id: str) -> None:
    assert job_id.isidentifier(), job_id  # spliced into the trigger's text
    dsn, schema = _postgres_target(store)
    function = f"""CREATE FUNCTION {schema}.refuse_{job_id}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refused by the test'; END $$"""
    trigger = (
        f"CREATE TRIGGER refuse_{job_id} BEFORE UPDATE ON {schema}.jobs FOR EACH ROW WHEN (OLD.id = '{job_id}')"
        f" EXECUTE FUNCTION {schema}.refuse_{job_id}()"
    )
    run_in_thread(lambda: pg_execute(dsn, function))
    run_in_thread(lambda: pg_execute(dsn, trigger))


def _postgres_target(store: QueueStore) -> tuple[str, str]:
    from asyncq.store.postgres.connection import parse_url

    target = parse_url(store.location)
    return target.dsn, target.schema


DRIVERS = {
    "sqlite": Driver(
        name="sqlite",
        fresh=_sqlite_fresh,
        open_another=_sqlite_another,
        open_read_only=_sqlite_read_only,
        open_backup=_sqlite_backup,
        force=_sqlite_force,
        refuse_updates_of=_sqlite_refuse_updates_of,
        capabilities=Capabilities(backup=True, app_sql=True, survives_power_loss=True, read_only=False),
        kind="sqlite",
    ),
    "postgresql": Driver(
        name="postgresql",
        fresh=_postgres_fresh,
        open_another=_postgres_another,
        open_read_only=_postgres_read_only,
        open_backup=_postgres_backup,
        force=_postgres_force,
        refuse_updates_of=_postgres_refuse_updates_of,
        capabilities=Capabilities(backup=False, app_sql=True, survives_power_loss=True, read_only=False),
        kind="postgresql",
    ),
}


@pytest.fixture(scope="session", params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """Each driver in turn (one value: Hypothesis tests may take it). PostgreSQL's needs the server: its tests skip
    with the reason when it does not answer (fail under ``CI=true``), and run in this run's own database."""
    if request.param == "postgresql":
        request.getfixturevalue("postgres_database")
    return DRIVERS[request.param]


@pytest.fixture
async def store(driver: Driver, tmp_path: Path) -> AsyncIterator[QueueStore]:
    """A fresh, empty store of ``driver``, closed after the test."""
    async with driver.fresh(tmp_path) as opened:
        yield opened
