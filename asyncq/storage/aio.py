"""The one seam between asyncio and the synchronous engine, and the file facade ``Queue`` and ``Outbox`` share.

A whole engine transaction runs as one call in the aiosqlite connection's own thread: one thread hop
per transaction (≈ 55-60 µs here) instead of one per statement, and no await can land inside
``BEGIN IMMEDIATE … COMMIT``. If the awaiting task is cancelled, the call still runs to its end in that
thread (commit or rollback), so a cancellation never leaves a lock behind; its outcome is then unknown
to the caller and must be read back from the row (``Queue.reconcile``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self, TypeVar, cast

import aiosqlite
import anyio

from asyncq.core.values import check_time
from asyncq.storage.connection import check_path

T = TypeVar("T")


async def run_sync(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sqlite3_connection, *args)`` in ``conn``'s thread, after everything queued before it."""
    raw: sqlite3.Connection = conn._conn  # aiosqlite keeps the sqlite3 connection private; reading it is safe
    return cast(T, await conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]


def _rollback_if_open(con: sqlite3.Connection) -> None:
    if con.in_transaction:
        con.execute("ROLLBACK")


class AppTransaction:
    """An open ``BEGIN IMMEDIATE`` on a file's connection, for the app's own SQL beside asyncq's rows."""

    def __init__(self, owner: AsyncFile) -> None:
        self._file = owner
        #: How many rows asyncq added in this transaction (waiters are woken after the commit if any).
        self.added = 0

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows."""
        return list(await self._file._conn.execute_fetchall(statement, parameters))

    async def _run_step(self, fn: Callable[..., T], *args: Any) -> T:
        """Run an engine step inside this transaction, in the connection's thread."""
        return await run_sync(self._file._conn, fn, *args)


TxT = TypeVar("TxT", bound=AppTransaction)


class AsyncFile:
    """One SQLite file behind one aiosqlite connection: the base of ``Queue`` and ``Outbox``.

    Writes of one process queue on an ``asyncio.Lock`` and run whole in the connection's thread; time comes
    from an injected clock; tasks waiting for new rows are woken in-process after a commit that added some.
    """

    def __init__(self, conn: aiosqlite.Connection, path: str, clock: Callable[[], int]) -> None:
        self._conn = conn
        self.path = path
        self._clock = clock
        self._lock = asyncio.Lock()
        self._waiters: set[asyncio.Event] = set()

    @staticmethod
    async def _connect(
        path: object, busy_timeout: float, setup: Callable[[sqlite3.Connection], object]
    ) -> tuple[aiosqlite.Connection, str]:
        """Connect in autocommit mode and run ``setup`` in the connection's thread; closed if it fails."""
        file = check_path(path)
        conn = await aiosqlite.connect(file, isolation_level=None, timeout=busy_timeout)
        try:
            await run_sync(conn, setup)
        except BaseException:
            await conn.close()
            raise
        return conn, file

    async def close(self) -> None:
        """Close the connection (waits for the transaction in progress)."""
        async with self._lock:
            await self._conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def now(self) -> int:
        """The clock's current time in milliseconds, checked."""
        return check_time(self._clock(), "clock()")

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._lock:
            return await run_sync(self._conn, fn, *args)

    def _notify(self) -> None:
        for event in self._waiters:
            event.set()

    async def wait_for_rows(self, timeout: float) -> None:
        """Return when this process commits new rows, or after ``timeout`` seconds; other processes' rows
        are only seen by polling."""
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        try:
            with anyio.move_on_after(timeout):
                await waiter.wait()
        finally:
            self._waiters.discard(waiter)

    @asynccontextmanager
    async def _transaction(self, tx: TxT) -> AsyncIterator[TxT]:
        """All of ``tx``'s statements commit together, or all roll back if the block raises or is cancelled.

        A cancelled BEGIN or COMMIT still runs later in the connection's thread, so whether a transaction is
        open is decided there, after it, never from this thread before it has run."""
        async with self._lock:
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                yield tx
                with anyio.CancelScope(shield=True):
                    await self._conn.execute("COMMIT")
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await run_sync(self._conn, _rollback_if_open)
                raise
        if tx.added:
            self._notify()
