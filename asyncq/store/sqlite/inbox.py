"""``SqliteInboxStore``: the inbox store's port on one SQLite file (``asyncq.store.port.inbox`` states the rules).

All the inbox's SQLite work runs in one thread owning its only connection (``asyncq.store.sqlite.aio``), so
concurrent requests queue in memory, in arrival order, instead of contending in SQLite's busy handler; the
file is in WAL with ``synchronous=FULL`` (asyncq's ``full`` level), so a returned ``record`` is durable.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Sequence

from asyncq.store.port.inbox import InboxEffect, InboxEvent, InboxResult, InboxTotals
from asyncq.store.sqlite.aio import AsyncFile
from asyncq.store.sqlite.connection import check_path, configure, write_transaction
from asyncq.store.sqlite.durability import FULL
from asyncq.store.sqlite.effects import effect_transaction

INBOX_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_inbox (id TEXT PRIMARY KEY, body TEXT NOT NULL,
  applied_at_ms INTEGER NOT NULL, duplicates INTEGER NOT NULL DEFAULT 0, conflicts INTEGER NOT NULL DEFAULT 0)""",
)
SELECT_BODY = "SELECT body FROM asyncq_inbox WHERE id = ?"
INSERT_EVENT = "INSERT INTO asyncq_inbox (id, body, applied_at_ms) VALUES (?, ?, ?)"
COUNT_DUPLICATE = "UPDATE asyncq_inbox SET duplicates = duplicates + 1 WHERE id = ?"
COUNT_CONFLICT = "UPDATE asyncq_inbox SET conflicts = conflicts + 1 WHERE id = ?"
TOTALS = "SELECT count(*), coalesce(sum(duplicates), 0), coalesce(sum(conflicts), 0) FROM asyncq_inbox"
BUSY_TIMEOUT_S = 5.0


def record_event(
    con: sqlite3.Connection, event_id: str, canonical: str, body: object, now_ms: int, effect: InboxEffect | None
) -> str:
    """Inside the caller's transaction: a new id gets its row and the effect (``'applied'``); a known id with
    the same canonical body counts a duplicate (``'duplicate'``), with another body a conflict (``'conflict'``)."""
    row = con.execute(SELECT_BODY, (event_id,)).fetchone()
    if row is None:
        con.execute(INSERT_EVENT, (event_id, canonical, now_ms))
        if effect is not None:
            with effect_transaction(con) as tx:
                effect(tx, event_id, body)
        return "applied"
    if row[0] == canonical:
        con.execute(COUNT_DUPLICATE, (event_id,))
        return "duplicate"
    con.execute(COUNT_CONFLICT, (event_id,))
    return "conflict"


def record_events(
    con: sqlite3.Connection, events: Sequence[InboxEvent], now_ms: int, effect: InboxEffect | None
) -> list[InboxResult]:
    """Record ``events`` in one write transaction, each in its own savepoint: an event whose effect raises is
    rolled back alone and gets its exception as its result."""
    results: list[InboxResult] = []
    with write_transaction(con):
        for event in events:
            con.execute("SAVEPOINT inbox_event")
            try:
                results.append(record_event(con, event.id, event.canonical, event.body, now_ms, effect))
            except Exception as error:
                if not con.in_transaction:  # SQLite rolled back by itself (disk full, I/O error): all of it failed
                    raise
                con.execute("ROLLBACK TO inbox_event")
                results.append(error)
            con.execute("RELEASE inbox_event")
    return results


def read_totals(con: sqlite3.Connection) -> InboxTotals:
    """The durable counts: rows, ``sum(duplicates)``, ``sum(conflicts)``."""
    applied, duplicates, conflicts = con.execute(TOTALS).fetchone()
    return InboxTotals(int(applied), int(duplicates), int(conflicts))


def read_totals_of_file(path: str, timeout: float) -> InboxTotals:
    """``read_totals`` on a read-only connection of its own to an existing inbox file."""
    from asyncq.store.sqlite.admin import connect_read_only, inspect

    with contextlib.closing(connect_read_only(path, timeout)) as con:
        inspect(con, path, table="asyncq_inbox")
        return read_totals(con)


def _open_tables(con: sqlite3.Connection, ddl: Sequence[str]) -> None:
    configure(con, FULL.journal_mode, FULL.synchronous)
    with write_transaction(con):
        for statement in (*INBOX_TABLES, *ddl):
            con.execute(statement)


class SqliteInboxStore:
    """The inbox store's port on one SQLite file. Open with ``await SqliteInboxStore.open(path, ddl=…)``."""

    def __init__(self, file: AsyncFile) -> None:
        self._file = file
        self.location = file.path

    @classmethod
    async def open(cls, path: object, *, ddl: Sequence[str] = ()) -> SqliteInboxStore:
        """Open ``path`` (created if missing, rows kept) and run the inbox's and ``ddl``'s ``CREATE … IF NOT
        EXISTS`` statements in one transaction."""
        file = check_path(path, "db")
        setup = functools.partial(_open_tables, ddl=tuple(ddl))
        return cls(AsyncFile(await AsyncFile.connect(file, BUSY_TIMEOUT_S, setup), file))

    async def record(self, events: Sequence[InboxEvent], now_ms: int, effect: InboxEffect | None) -> list[InboxResult]:
        results: list[InboxResult] = await self._file.run(record_events, events, now_ms, effect)
        return results

    async def totals(self) -> InboxTotals:
        totals: InboxTotals = await self._file.run(read_totals)
        return totals

    async def close(self) -> None:
        await self._file.close()
