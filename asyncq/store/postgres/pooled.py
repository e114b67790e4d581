"""What the outbox's and the inbox's PostgreSQL stores share: a pool opened on a URL with the component migrated
(under the advisory lock), one call a transaction or a statement on a pooled connection, transient failures as
``PostgresBusy``, and the app's own asyncpg connection checked before asyncq writes on it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from asyncq.store.postgres.connection import Connection, Migrations, Target, migrate, open_pool, parse_url
from asyncq.store.postgres.failures import as_busy, is_lost

T = TypeVar("T")


def raise_translated(error: BaseException, location: str) -> NoReturn:
    """Raise ``error`` again, or the ``PostgresBusy`` it stands for (with ``error`` as its cause)."""
    busy = as_busy(error, location)
    if busy is error:
        raise error
    raise busy from error


def app_connection(connection: object) -> Connection:
    """The app's own asyncpg connection, with its transaction open, to write asyncq's rows on: ``TypeError`` for
    anything else, ``ValueError`` if no transaction is open (the rows would commit on their own)."""
    if not isinstance(connection, asyncpg.Connection | PoolConnectionProxy):
        raise TypeError(f"connection must be an asyncpg connection, not {type(connection).__name__}")
    if not connection.is_in_transaction():
        raise ValueError("connection has no transaction open: call it inside `async with conn.transaction()`")
    return connection


@contextlib.asynccontextmanager
async def dropped_if_lost(conn: Connection) -> AsyncIterator[None]:
    """Inside, a pooled connection that fails as lost (``failures.is_lost``) is terminated before the pool takes
    it back: the pool opens a fresh one instead of handing out a connection a fault left closed or mid-operation."""
    try:
        yield
    except Exception as error:
        if is_lost(error):
            # A connection the pool already took back (its loss seen first) refuses every call: nothing to drop.
            with contextlib.suppress(asyncpg.InterfaceError):
                if not conn.is_closed():
                    conn.terminate()
        raise


async def one_row(conn: Connection, statement: str, *args: Any) -> asyncpg.Record:
    """The row of a statement that always returns exactly one (a ``SELECT`` of aggregates or sub-selects)."""
    row: asyncpg.Record | None = await conn.fetchrow(statement, *args)
    assert row is not None, statement
    return row


class PooledStore:
    """A component's tables in the schema a URL names, reached through a pool of its own."""

    def __init__(self, target: Target, pool: asyncpg.Pool) -> None:
        self.target = target
        self.schema = target.schema
        #: The URL without its password.
        self.location = target.location
        self._pool = pool

    @classmethod
    async def open_target(
        cls,
        url: object,
        migrations: Migrations,
        prepare: Callable[[Connection, str], Awaitable[None]] | None = None,
        *,
        size: int | None = None,
    ) -> tuple[Target, asyncpg.Pool]:
        """The URL checked, a pool of ``size`` connections (the URL's ``pool_size`` by default) opened and
        ``migrations`` run; then ``prepare(conn, schema)`` if given. Nothing is left open if any of it fails."""
        target = parse_url(url)
        pool = await open_pool(target, size=size)
        try:
            async with pool.acquire() as conn:
                await migrate(conn, target.schema, migrations)
                if prepare is not None:
                    await prepare(conn, target.schema)
        except BaseException as error:
            await pool.close()
            raise_translated(error, target.location)
        return target, pool

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(conn, schema, *args)`` in one transaction on a pooled connection."""
        try:
            async with self._pool.acquire() as conn, dropped_if_lost(conn), conn.transaction():
                return await fn(conn, self.schema, *args)
        except Exception as error:
            raise_translated(error, self.location)

    async def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(conn, schema, *args)`` on a pooled connection outside a transaction: for a call that is one
        statement (its own transaction, one round trip)."""
        try:
            async with self._pool.acquire() as conn, dropped_if_lost(conn):
                return await fn(conn, self.schema, *args)
        except Exception as error:
            raise_translated(error, self.location)

    async def close(self) -> None:
        """Close after the calls in progress (the pool waits for every connection to come back)."""
        await self._pool.close()
