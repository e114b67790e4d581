"""The one seam between asyncio and the synchronous engine, and the file facade ``Queue`` and ``Outbox`` share.

A whole engine transaction runs as one call in the aiosqlite connection's own thread: one thread hop
per transaction (≈ 55-60 µs here) instead of one per statement, and no await can land inside
``BEGIN IMMEDIATE … COMMIT``. If the awaiting task is cancelled, the call still runs to its end in that
thread (commit or rollback), so a cancellation never leaves a lock behind; its outcome is then unknown
to the caller and must be read back from the row (``Queue.reconcile``).

The worker pool's group commit is the exception (``AsyncFile._run_held``): its statements run on the event
loop's thread once ``BEGIN IMMEDIATE`` holds the write lock, so they wait for nothing; only a BEGIN that
must wait for another process's lock, and every ``COMMIT`` (the disk's wait), run in the connection's
thread. In that thread, each of a cycle's ~150 statement steps had to win the GIL back from a busy event
loop, and each hop cost 1-3 ms of the loop's time: a 1 ms cycle took 5 ms (docs/architecture.md).
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
from asyncq.store.sqlite.connection import check_path

T = TypeVar("T")


async def run_sync(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sqlite3_connection, *args)`` in ``conn``'s thread, after everything queued before it."""
    raw: sqlite3.Connection = conn._conn  # aiosqlite keeps the sqlite3 connection private; reading it is safe
    return cast(T, await conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]


def _rollback_if_open(con: sqlite3.Connection) -> None:
    if con.in_transaction:
        con.execute("ROLLBACK")


def _begin(con: sqlite3.Connection) -> None:
    con.execute("BEGIN IMMEDIATE")


def _commit(con: sqlite3.Connection) -> None:
    con.execute("COMMIT")


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
        self._busy_ms: int | None = None  # the connection's busy timeout, read once

    @staticmethod
    async def _connect(
        path: object, busy_timeout: float, setup: Callable[[sqlite3.Connection], object]
    ) -> tuple[aiosqlite.Connection, str]:
        """Connect in autocommit mode and run ``setup`` in the connection's thread; closed if it fails."""
        file = check_path(path)
        # check_same_thread=False: ``_run_held`` runs statements on the loop's thread; the lock keeps every use
        # of the connection one at a time.
        conn = await aiosqlite.connect(file, isolation_level=None, timeout=busy_timeout, check_same_thread=False)
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

    async def _run_held(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(sqlite3_connection, *args)`` inside one write transaction, called on this (the loop's) thread.

        ``fn`` runs with the write lock held, so its statements never wait for a lock (keep it to short
        statements). ``BEGIN IMMEDIATE`` is tried here without waiting, and only if another connection holds
        the lock is it sent to the connection's thread to wait there; ``COMMIT`` (the disk's wait) always runs
        in that thread. If ``fn`` or the commit fails, or the task is cancelled while BEGIN waits, the
        transaction is rolled back; once ``fn`` has run, the commit is shielded and lands or fails whole."""
        async with self._lock:
            con: sqlite3.Connection = self._conn._conn
            try:
                if not self._begin_without_waiting(con):
                    await run_sync(self._conn, _begin)
                result = fn(con, *args)
                with anyio.CancelScope(shield=True):
                    await run_sync(self._conn, _commit)
            except BaseException:
                with anyio.CancelScope(shield=True):  # runs after a cancelled BEGIN, in the thread's order
                    await run_sync(self._conn, _rollback_if_open)
                raise
            return result

    def _begin_without_waiting(self, con: sqlite3.Connection) -> bool:
        """``BEGIN IMMEDIATE`` if the write lock is free now; ``False`` (nothing open) if another connection
        holds it. A hop to the connection's thread costs 1-3 ms of a busy loop's time; this costs µs."""
        if self._busy_ms is None:
            self._busy_ms = int(con.execute("PRAGMA busy_timeout").fetchone()[0])
        con.execute("PRAGMA busy_timeout = 0")
        try:
            con.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # any SQLITE_BUSY_* extended code
                raise
            return False
        finally:
            con.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

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
