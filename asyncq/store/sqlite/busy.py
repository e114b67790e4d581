"""SQLite's busy and locked errors as the port's ``StoreBusy``, so that callers above the driver can tell "try again"
from every other failure without knowing SQLite."""

from __future__ import annotations

import sqlite3

from asyncq.errors import StoreBusy

BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


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


def as_busy(error: sqlite3.OperationalError) -> sqlite3.OperationalError:
    """``error`` as ``SqliteBusy`` if it is a busy/locked error (any extended code), else ``error`` itself."""
    if isinstance(error, SqliteBusy) or not is_busy(error):
        return error
    busy = SqliteBusy(*error.args)
    busy.sqlite_errorcode = error.sqlite_errorcode
    busy.sqlite_errorname = error.sqlite_errorname
    return busy
