"""Opening SQLite files with every setting stated, and running one short write transaction.

Every write starts with ``BEGIN IMMEDIATE``: a deferred transaction that later upgrades to a writer gets
``SQLITE_BUSY`` at once instead of waiting in the busy handler, and would turn contention into errors.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from asyncq.store.sqlite.busy import begin_immediate

Hook = Callable[[str], object] | None

JOURNAL_MODES = ("DELETE", "WAL")
SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


def check_path(path: object, name: str = "path") -> str:
    """A file system path (``str`` or ``os.PathLike``) naming a file, never the in-memory database."""
    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"{name} must be a str or os.PathLike, not {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or text in ("", ":memory:") or "\0" in text:
        raise ValueError(f"{name} must name a local file, got {text!r}")
    return text


def open_file(
    path: object,
    ddl: Iterable[str],
    *,
    journal_mode: str = "DELETE",
    synchronous: str = "FULL",
    timeout: float = 1.0,
    check_same_thread: bool = True,
) -> sqlite3.Connection:
    """Open ``path`` in autocommit mode with the given journal and sync levels, then run ``ddl`` in one
    ``BEGIN IMMEDIATE`` transaction (``CREATE … IF NOT EXISTS``: existing rows are kept).

    The connection is closed if any step fails.
    """
    file = check_path(path)
    check_levels(journal_mode, synchronous)  # before connecting, which would create the file
    con = sqlite3.connect(file, isolation_level=None, timeout=timeout, check_same_thread=check_same_thread)
    try:
        configure(con, journal_mode, synchronous)
        with write_transaction(con):
            for statement in ddl:
                con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con


def check_levels(journal_mode: str, synchronous: str) -> None:
    """Only the journal modes and synchronous levels asyncq states durability for."""
    if journal_mode not in JOURNAL_MODES or synchronous not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"unsupported journal_mode={journal_mode!r} or synchronous={synchronous!r}")


def configure(con: sqlite3.Connection, journal_mode: str, synchronous: str) -> None:
    """Set and verify the journal mode (it can silently stay as it was) and the synchronous level."""
    check_levels(journal_mode, synchronous)
    mode = con.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0]
    if str(mode).upper() != journal_mode:
        raise sqlite3.OperationalError(f"could not set journal_mode={journal_mode} (got {mode})")
    con.execute(f"PRAGMA synchronous={synchronous}")
    # The claim's sub-selects build small temporary b-trees; kept in memory they cost ~35 µs instead of
    # ~270 µs of temp-file pages re-faulted on every claim (measured: docs/benchmarks.md, throughput).
    con.execute("PRAGMA temp_store=MEMORY")


def write_transaction(con: sqlite3.Connection) -> AbstractContextManager[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; any exception (a fault hook's included) rolls everything back
    and propagates unchanged. A failed COMMIT is rolled back too, so no transaction is ever left open. A lock
    held elsewhere is waited for in short sleeps up to the busy timeout (``busy.begin_immediate``)."""
    return _WriteTransaction(con)


class _WriteTransaction:
    """``write_transaction``'s context manager: a class, not a generator's (every write enters one; the generator's
    machinery was 4 Python calls of an enqueue's 33 in the connection's thread)."""

    __slots__ = ("_con",)

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    def __enter__(self) -> sqlite3.Connection:
        begin_immediate(self._con)
        return self._con

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        con = self._con
        if exc_type is None:
            try:
                con.execute("COMMIT")
                return
            except BaseException:
                _roll_back(con)
                raise
        _roll_back(con)


def _roll_back(con: sqlite3.Connection) -> None:
    if con.in_transaction:
        # The original error matters more; SQLite may have rolled back by itself already.
        with contextlib.suppress(sqlite3.Error):
            con.execute("ROLLBACK")


def call_hook(fault: Hook, point: str) -> None:
    """Call the fault hook at ``point`` (no-op without a hook)."""
    if fault is not None:
        fault(point)
