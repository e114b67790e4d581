"""SQLite's busy and locked errors as the port's ``StoreBusy``, so that callers above the driver can tell "try again"
from every other failure without knowing SQLite."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from asyncq.errors import StoreBusy

BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
#: A write that finds the lock held elsewhere tries again after an eighth of the time it has waited, within these.
RETRY_MIN_S, RETRY_MAX_S = 0.0001, 0.005


class SqliteBusy(StoreBusy, sqlite3.OperationalError):
    """``database is locked`` (or a table locked by another connection of this process): nothing changed."""


def is_busy(error: sqlite3.OperationalError, codes: tuple[int, ...] = BUSY_CODES) -> bool:
    """Whether ``error`` is one of ``codes`` (busy or locked by default), whatever its extended code."""
    return (getattr(error, "sqlite_errorcode", 0) & 0xFF) in codes


def try_begin(con: sqlite3.Connection, codes: tuple[int, ...] = BUSY_CODES) -> bool:
    """``BEGIN IMMEDIATE`` at the connection's busy timeout: ``False`` (nothing open) if another connection holds
    the write lock (an error of ``codes``); any other error is raised."""
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        if not is_busy(error, codes):
            raise
        return False
    return True


class TimedConnection(sqlite3.Connection):
    """A connection that keeps its busy timeout as opened and whether it is in force now (or 0), so that switching
    it to the state it is in runs nothing: SQLite prepares a ``PRAGMA busy_timeout`` again at every run (about 15k
    instructions), and a write switched it to 0 and back, three pragmas an enqueue (docs/benchmarks.md, "singles").

    In WAL mode (``wal``, set once the file's mode is known) a write leaves the timeout at 0: its statements hold the
    write lock, a WAL commit takes no other lock, and its checkpoint is passive. Whoever runs a call that may wait
    (a read) puts the timeout back first (``set_waiting``; ``aio.AsyncFile.run`` does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy_ms = int(self.execute("PRAGMA busy_timeout").fetchone()[0])
        self.waiting = True  # the busy timeout is in force (else it is 0)
        self.wal = False


def timeout_ms(con: sqlite3.Connection) -> int:
    """The connection's busy timeout as opened (read from SQLite unless the connection keeps it)."""
    if isinstance(con, TimedConnection):
        return con.busy_ms
    return int(con.execute("PRAGMA busy_timeout").fetchone()[0])


def set_waiting(con: sqlite3.Connection, waiting: bool, timeout: int | None = None) -> None:
    """The busy timeout ``timeout`` (default: as opened) in force if ``waiting``, else 0; a ``TimedConnection``
    already in that state runs nothing."""
    if isinstance(con, TimedConnection):
        if con.waiting is waiting:
            return
        con.execute(f"PRAGMA busy_timeout = {con.busy_ms if waiting else 0}")
        con.waiting = waiting
        return
    con.execute(f"PRAGMA busy_timeout = {(timeout_ms(con) if timeout is None else timeout) if waiting else 0}")


def leaves_timeout_off(con: sqlite3.Connection) -> bool:
    """Whether a write on ``con`` may leave its busy timeout at 0 (a ``TimedConnection`` in WAL mode)."""
    return isinstance(con, TimedConnection) and con.wal


def begin_immediate(con: sqlite3.Connection, sleep: Callable[[float], object] = time.sleep) -> None:
    """``BEGIN IMMEDIATE``, waiting for a write lock held elsewhere up to the connection's busy timeout, then its busy
    error as SQLite raises it.

    Tried again after an eighth of the time waited so far (0.1 ms at first, at most 5 ms), not in SQLite's busy
    handler, which sleeps 1, 2, 5 … 100 ms between tries: a pool in another process holds the lock for a commit
    of a few tenths of a millisecond, and a producer that met it slept 1 ms or more in that handler each time
    (one-at-a-time enqueues beside another process's pool; docs/benchmarks.md, "singles"). ``sleep`` is the
    wait between tries (a test's stands in for it). The timeout is put back afterwards unless
    ``leaves_timeout_off``. A ``TimedConnection`` whose timeout is off already (a WAL write left it so) tries once
    first, before any of that."""
    if isinstance(con, TimedConnection) and not con.waiting and try_begin(con, (sqlite3.SQLITE_BUSY,)):
        return
    timeout = timeout_ms(con)
    if timeout <= 0:
        con.execute("BEGIN IMMEDIATE")
        return
    set_waiting(con, False, timeout)
    try:
        started = time.monotonic()
        while not try_begin(con, (sqlite3.SQLITE_BUSY,)):
            waited = time.monotonic() - started
            left = timeout / 1000 - waited
            if left <= 0:
                con.execute("BEGIN IMMEDIATE")  # the busy error, unless the lock was freed just now
                return
            sleep(min(max(waited / 8, RETRY_MIN_S), RETRY_MAX_S, left))
    finally:
        if not leaves_timeout_off(con):
            set_waiting(con, True, timeout)


def as_busy(error: sqlite3.OperationalError) -> sqlite3.OperationalError:
    """``error`` as ``SqliteBusy`` if it is a busy/locked error (any extended code), else ``error`` itself."""
    if isinstance(error, SqliteBusy) or not is_busy(error):
        return error
    busy = SqliteBusy(*error.args)
    busy.sqlite_errorcode = error.sqlite_errorcode
    busy.sqlite_errorname = error.sqlite_errorname
    return busy
