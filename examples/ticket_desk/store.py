"""The ticket desk's one SQLite file: registrations, tickets, completion keys and the outbox.

``tickets.registration_id`` is deliberately not unique: a handler without a completion key can write two
tickets for one registration, and ``desk.py repair`` mends that. ``completed`` has exactly one column so
that the handler's ``INSERT OR IGNORE INTO completed VALUES (?)`` runs as written.

Connections are in Python's default transaction mode, where ``with db:`` commits on success and rolls
back on an exception: the mode the handlers are written for.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = (
    "CREATE TABLE registrations (id TEXT PRIMARY KEY, name TEXT NOT NULL, registered_at TEXT NOT NULL)",
    """CREATE TABLE tickets (ticket_no INTEGER PRIMARY KEY AUTOINCREMENT, registration_id TEXT NOT NULL,
  name TEXT NOT NULL, issued_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)""",
    "CREATE INDEX tickets_by_registration ON tickets (registration_id, ticket_no)",
    "CREATE TABLE completed (id TEXT PRIMARY KEY)",
    """CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL,
  body TEXT NOT NULL, created_at TEXT NOT NULL, sent_at TEXT)""",
    "CREATE INDEX outbox_unsent ON outbox (seq) WHERE sent_at IS NULL",
)

# The store as the studio hands it over: Mina Patel's registration and ticket, which everything preserves.
SEED = (
    ("INSERT INTO registrations VALUES ('R-0001', 'Mina Patel', '2026-11-02T18:00:00+00:00')", ()),
    ("INSERT INTO tickets VALUES (1, 'R-0001', 'Mina Patel', '2026-11-02 18:05:00')", ()),
    ("INSERT INTO completed VALUES ('R-0001')", ()),
)

NEXT_ID = "SELECT coalesce(max(CAST(substr(id, 3) AS INTEGER)), 0) + 1 FROM registrations"


@dataclass(frozen=True)
class Registration:
    """A guest's registration, with the numbers of its tickets (oldest first)."""

    id: str
    name: str
    ticket_numbers: tuple[int, ...]
    completed: bool


@dataclass(frozen=True)
class Ticket:
    """One issued ticket."""

    ticket_no: int
    registration_id: str
    name: str
    issued_at: str


@dataclass(frozen=True)
class OutboxRow:
    """A message waiting to be published (``body`` is JSON text)."""

    seq: int
    message_id: str
    body: str


def now_text() -> str:
    """The current time as ISO 8601 text."""
    return datetime.now(UTC).isoformat(timespec="seconds")


#: Seconds a write waits for another writer's transaction (a worker paused inside one holds it indefinitely).
BUSY_TIMEOUT = float(os.environ.get("TICKET_DESK_BUSY_TIMEOUT") or 10.0)


def connect(path: Path | str) -> sqlite3.Connection:
    """Open the store for writing, in the default transaction mode; creates and seeds it when the file has
    no schema yet. Opening takes no lock when the schema exists."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT)
    try:
        if _version(db) == 0:
            _create_once(db)
    except BaseException:
        db.close()
        raise
    return db


def connect_read(path: Path | str) -> sqlite3.Connection:
    """Open the store for reading only (``query_only``): in WAL mode it reads the last committed rows even
    while a worker holds a write transaction open, e.g. paused at ``inside-transaction``."""
    db = connect(path)
    db.execute("PRAGMA query_only = ON")
    return db


def read(path: Path | str, operation: Callable[..., T], *args: Any) -> T:
    """``operation(db, *args)`` on a read-only connection of its own, closed afterwards (any thread may call)."""
    return _on(connect_read(path), operation, *args)


def write(path: Path | str, operation: Callable[..., T], *args: Any) -> T:
    """``operation(db, *args)`` on a write connection of its own, closed afterwards (any thread may call)."""
    return _on(connect(path), operation, *args)


def _on(db: sqlite3.Connection, operation: Callable[..., T], *args: Any) -> T:
    try:
        return operation(db, *args)
    finally:
        db.close()


def is_busy(error: sqlite3.OperationalError) -> bool:
    """Whether ``error`` means another writer held the store for longer than :data:`BUSY_TIMEOUT`."""
    return "locked" in str(error) or "busy" in str(error)


def _version(db: sqlite3.Connection) -> int:
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    return version


def _create_once(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")  # persistent in the file: set once, when it is created
    db.execute("BEGIN IMMEDIATE")  # two processes starting on a fresh file: one creates, one waits
    try:
        if _version(db) == 0:
            _create(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _create(db: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        db.execute(statement)
    for statement, params in SEED:
        db.execute(statement, params)
    db.execute("PRAGMA user_version = 1")


def reset(db: sqlite3.Connection, keep_copy_at: Path | None = None) -> None:
    """Make the store fresh again in one transaction: every table dropped (asyncq's consumer tables too),
    then the schema and Mina Patel's registration and ticket. With ``keep_copy_at``, the committed rows
    are first copied there (SQLite's online backup). The file stays, so a running site keeps working. A
    writer holding the file makes this fail after :data:`BUSY_TIMEOUT` with nothing changed or copied."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if keep_copy_at is not None:
            _copy_committed(db, keep_copy_at)
        tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        for (table,) in tables.fetchall():
            quoted = table.replace('"', '""')
            db.execute(f'DROP TABLE "{quoted}"')
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
            db.execute("DELETE FROM sqlite_sequence")
        _create(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _copy_committed(db: sqlite3.Connection, destination: Path) -> None:
    """Copy the store's committed rows to ``destination`` (replacing it) through a second connection: the
    caller's write transaction has changed nothing yet, so the copy is exactly the store before."""
    source = sqlite3.connect(db.execute("PRAGMA database_list").fetchone()[2])
    destination.unlink(missing_ok=True)
    copy = sqlite3.connect(destination)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()


def register(db: sqlite3.Connection, name: str) -> str:
    """Store a registration and its outbox message in one transaction; return the new id (``R-0002``…)."""
    with db:
        db.execute("BEGIN IMMEDIATE")  # the next id is read and used by the same writer
        number = db.execute(NEXT_ID).fetchone()[0]
        registration_id = f"R-{number:04d}"
        db.execute("INSERT INTO registrations VALUES (?, ?, ?)", (registration_id, name, now_text()))
        body = json.dumps({"id": registration_id, "name": name})
        db.execute(
            "INSERT INTO outbox (message_id, body, created_at) VALUES (?, ?, ?)",
            (registration_id, body, now_text()),
        )
    return registration_id


def registrations(db: sqlite3.Connection) -> list[Registration]:
    """Every registration, in id order."""
    rows = db.execute("SELECT id, name FROM registrations ORDER BY id").fetchall()
    return [_with_tickets(db, registration_id, name) for registration_id, name in rows]


def registration(db: sqlite3.Connection, registration_id: str) -> Registration | None:
    """One registration, or ``None``."""
    row = db.execute("SELECT id, name FROM registrations WHERE id = ?", (registration_id,)).fetchone()
    return None if row is None else _with_tickets(db, row[0], row[1])


def _with_tickets(db: sqlite3.Connection, registration_id: str, name: str) -> Registration:
    numbers = db.execute(
        "SELECT ticket_no FROM tickets WHERE registration_id = ? ORDER BY ticket_no", (registration_id,)
    ).fetchall()
    done = db.execute("SELECT 1 FROM completed WHERE id = ?", (registration_id,)).fetchone()
    return Registration(registration_id, name, tuple(n for (n,) in numbers), done is not None)


def ticket(db: sqlite3.Connection, ticket_no: int) -> Ticket | None:
    """One ticket, or ``None``."""
    row = db.execute(
        "SELECT ticket_no, registration_id, name, issued_at FROM tickets WHERE ticket_no = ?", (ticket_no,)
    ).fetchone()
    return None if row is None else Ticket(*row)


def tickets_for(db: sqlite3.Connection, registration_id: str) -> list[Ticket]:
    """The tickets of one registration, oldest first."""
    rows = db.execute(
        "SELECT ticket_no, registration_id, name, issued_at FROM tickets WHERE registration_id = ? ORDER BY ticket_no",
        (registration_id,),
    ).fetchall()
    return [Ticket(*row) for row in rows]


def completion_keys(db: sqlite3.Connection) -> int:
    """How many completion keys exist."""
    count: int = db.execute("SELECT count(*) FROM completed").fetchone()[0]
    return count


def unsent(db: sqlite3.Connection, limit: int) -> list[OutboxRow]:
    """Outbox messages not yet confirmed by the broker, oldest first."""
    rows = db.execute(
        "SELECT seq, message_id, body FROM outbox WHERE sent_at IS NULL ORDER BY seq LIMIT ?", (limit,)
    ).fetchall()
    return [OutboxRow(*row) for row in rows]


def mark_sent(db: sqlite3.Connection, seq: int) -> None:
    """Record that the broker confirmed outbox message ``seq``."""
    with db:
        db.execute("UPDATE outbox SET sent_at = ? WHERE seq = ? AND sent_at IS NULL", (now_text(), seq))
