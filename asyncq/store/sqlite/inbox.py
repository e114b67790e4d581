"""The inbox's storage: its table, named statements, and recording events with their effect.

``asyncq.inbox`` serves HTTP and runs these in its writer thread; see its docstring for the rules.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from asyncq.core.values import check_identifier, check_int
from asyncq.errors import Permanent
from asyncq.store.sqlite.connection import write_transaction

#: The user's effect, run inside the inbox row's write transaction: ``effect(con, event_id, body)``.
Effect = Callable[[sqlite3.Connection, str, Any], None]


INBOX_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_inbox (id TEXT PRIMARY KEY, body TEXT NOT NULL,
  applied_at_ms INTEGER NOT NULL, duplicates INTEGER NOT NULL DEFAULT 0, conflicts INTEGER NOT NULL DEFAULT 0)""",
)
SELECT_BODY = "SELECT body FROM asyncq_inbox WHERE id = ?"
INSERT_EVENT = "INSERT INTO asyncq_inbox (id, body, applied_at_ms) VALUES (?, ?, ?)"
COUNT_DUPLICATE = "UPDATE asyncq_inbox SET duplicates = duplicates + 1 WHERE id = ?"
COUNT_CONFLICT = "UPDATE asyncq_inbox SET conflicts = conflicts + 1 WHERE id = ?"
TOTALS = "SELECT count(*), coalesce(sum(duplicates), 0), coalesce(sum(conflicts), 0) FROM asyncq_inbox"

# The example effect's table: what `--effect stock` and the examples use.
STOCK_TABLES = ("CREATE TABLE IF NOT EXISTS stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL)",)


def add_to_stock(con: sqlite3.Connection, event_id: str, body: Any) -> None:
    """Example effect: add the body's ``qty`` (int 1-1000) to the ``stock`` row of its ``item`` (default
    ``snack``). A body without a valid ``qty`` is ``Permanent``: no retry can fix it."""
    try:
        if type(body) is not dict:
            raise ValueError("body must be a JSON object")
        qty = check_int(body.get("qty"), "qty", 1, 1000)
        item = check_identifier(body.get("item", "snack"), "item")
    except ValueError as exc:
        raise Permanent(str(exc)) from None
    con.execute(
        "INSERT INTO stock (item, qty) VALUES (?, ?) ON CONFLICT(item) DO UPDATE SET qty = qty + excluded.qty",
        (item, qty),
    )


def record_event(
    con: sqlite3.Connection, event_id: str, canonical: str, body: Any, now_ms: int, effect: Effect | None
) -> str:
    """Inside the caller's transaction: a new id gets its row and the effect (``'applied'``); a known id with
    the same canonical body counts a duplicate (``'duplicate'``), with another body a conflict (``'conflict'``)."""
    row = con.execute(SELECT_BODY, (event_id,)).fetchone()
    if row is None:
        con.execute(INSERT_EVENT, (event_id, canonical, now_ms))
        if effect is not None:
            effect(con, event_id, body)
            if not con.in_transaction:
                raise RuntimeError("the effect ended the inbox transaction")
        return "applied"
    if row[0] == canonical:
        con.execute(COUNT_DUPLICATE, (event_id,))
        return "duplicate"
    con.execute(COUNT_CONFLICT, (event_id,))
    return "conflict"


def record_events(
    con: sqlite3.Connection, events: Sequence[tuple[str, str, Any]], now_ms: int, effect: Effect | None
) -> list[str | Exception]:
    """Record ``(event_id, canonical, body)`` events in one write transaction, each in its own savepoint:
    an event whose effect raises is rolled back alone and gets its exception as its result."""
    results: list[str | Exception] = []
    with write_transaction(con):
        for event_id, canonical, body in events:
            con.execute("SAVEPOINT inbox_event")
            try:
                results.append(record_event(con, event_id, canonical, body, now_ms, effect))
            except Exception as error:
                if not con.in_transaction:
                    raise
                con.execute("ROLLBACK TO inbox_event")
                results.append(error)
            con.execute("RELEASE inbox_event")
    return results
