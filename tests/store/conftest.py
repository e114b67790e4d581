"""The store conformance suite's fixtures: ``store`` is a fresh, empty queue store of each driver in ``DRIVERS``,
opened in the test's ``tmp_path`` and closed after it.

A driver is one entry of ``DRIVERS``: how to open a fresh store (and a read-only second handle on it), the few
facts where stores may differ (its capabilities, the kind ``describe`` names), and a test factory for the one
state the port cannot reach. Every test takes ``store`` (and ``driver`` for those facts) and runs unchanged on each
(the model: River's ``riverdrivertest.Exercise``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncq.store.port.queue import Capabilities, QueueStore
from asyncq.store.sqlite.queue_store import SqliteQueueStore


@dataclass(frozen=True)
class Driver:
    """What the suite needs of a driver beyond the port."""

    name: str
    #: A fresh, empty store of this driver (a file, a schema…) under the given folder, at its default settings.
    open: Callable[[Path], Awaitable[QueueStore]]
    #: A second handle on the same store, as another process would open it (its own connection).
    open_another: Callable[[QueueStore], Awaitable[QueueStore]]
    #: A second, read-only handle on the same store.
    open_read_only: Callable[[QueueStore], Awaitable[QueueStore]]
    #: Opens the store a successful ``backup(target)`` wrote (drivers with ``capabilities.backup``).
    open_backup: Callable[[str], Awaitable[QueueStore]]
    #: Sets columns of one job directly: for states no port call can make (River's test factory does the same).
    force: Callable[[QueueStore, str, dict[str, Any]], None]
    #: Makes every later update of one job's row fail with "refused by the test" (a trigger): a failure in the
    #: middle of a call's transaction, after its other statements have run.
    refuse_updates_of: Callable[[QueueStore, str], None]
    #: What a fresh store of this driver says it can do.
    capabilities: Capabilities
    #: ``describe()["store"]``.
    kind: str


async def _sqlite_open(folder: Path) -> QueueStore:
    return await SqliteQueueStore.open(folder / "queue.db")


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


DRIVERS = {
    "sqlite": Driver(
        name="sqlite",
        open=_sqlite_open,
        open_another=_sqlite_another,
        open_read_only=_sqlite_read_only,
        open_backup=_sqlite_backup,
        force=_sqlite_force,
        refuse_updates_of=_sqlite_refuse_updates_of,
        capabilities=Capabilities(backup=True, app_sql=True, survives_power_loss=True, read_only=False),
        kind="sqlite",
    ),
}


@pytest.fixture(scope="session", params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """Each driver in turn (one value: Hypothesis tests may take it)."""
    return DRIVERS[request.param]


@pytest.fixture
async def store(driver: Driver, tmp_path: Path) -> AsyncIterator[QueueStore]:
    """A fresh, empty store of ``driver``, closed after the test."""
    opened = await driver.open(tmp_path)
    try:
        yield opened
    finally:
        await opened.close()
