"""SQLite's busy and locked errors as the port's ``StoreBusy``, so that callers above the driver can tell "try again"
from every other failure without knowing SQLite."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

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


def begin_immediate(con: sqlite3.Connection, sleep: Callable[[float], object] = time.sleep) -> None:
    """``BEGIN IMMEDIATE``, waiting for a write lock held elsewhere up to the connection's busy timeout, then its busy
    error as SQLite raises it.

    Tried again after an eighth of the time waited so far (0.1 ms at first, at most 5 ms), not in SQLite's busy
    handler, which sleeps 1, 2, 5 … 100 ms between tries: a pool in another process holds the lock for a commit
    of a few tenths of a millisecond, and a producer that met it slept 1 ms or more in that handler each time
    (one-at-a-time enqueues beside another process's pool; docs/benchmarks.md, "singles"). ``sleep`` is the
    wait between tries (a test's stands in for it)."""
    timeout_ms = int(con.execute("PRAGMA busy_timeout").fetchone()[0])
    if timeout_ms <= 0:
        con.execute("BEGIN IMMEDIATE")
        return
    con.execute("PRAGMA busy_timeout = 0")
    try:
        started = time.monotonic()
        while not try_begin(con, (sqlite3.SQLITE_BUSY,)):
            waited = time.monotonic() - started
            left = timeout_ms / 1000 - waited
            if left <= 0:
                con.execute("BEGIN IMMEDIATE")  # the busy error, unless the lock was freed just now
                return
            sleep(min(max(waited / 8, RETRY_MIN_S), RETRY_MAX_S, left))
    finally:
        con.execute(f"PRAGMA busy_timeout = {timeout_ms}")


def as_busy(error: sqlite3.OperationalError) -> sqlite3.OperationalError:
    """``error`` as ``SqliteBusy`` if it is a busy/locked error (any extended code), else ``error`` itself."""
    if isinstance(error, SqliteBusy) or not is_busy(error):
        return error
    busy = SqliteBusy(*error.args)
    busy.sqlite_errorcode = error.sqlite_errorcode
    busy.sqlite_errorname = error.sqlite_errorname
    return busy
