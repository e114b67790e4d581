"""SQLite's busy and locked errors as the port's ``StoreBusy``, so that callers above the driver can tell "try again"
from every other failure without knowing SQLite."""

from __future__ import annotations

import sqlite3

from asyncq.errors import StoreBusy

BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqliteBusy(StoreBusy, sqlite3.OperationalError):
    """``database is locked`` (or a table locked by another connection of this process): nothing changed."""


def as_busy(error: sqlite3.OperationalError) -> sqlite3.OperationalError:
    """``error`` as ``SqliteBusy`` if it is a busy/locked error (any extended code), else ``error`` itself."""
    if isinstance(error, SqliteBusy) or (getattr(error, "sqlite_errorcode", 0) & 0xFF) not in BUSY_CODES:
        return error
    busy = SqliteBusy(*error.args)
    busy.sqlite_errorcode = error.sqlite_errorcode
    busy.sqlite_errorname = error.sqlite_errorname
    return busy
