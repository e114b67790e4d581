"""The outbox lab contract: mark an item done only after a verifiable ACK.

An order and its outbox row commit together (:func:`accept`); :func:`dispatch` reads one batch in ``seq`` order,
sends each item with no transaction open, and stores ``sent=1`` only after the exact ACK, with the id it selected.
On the first failure it stops: earlier items stay sent, the failing one is re-sent later with the **same id**, and
the receiver's inbox (:func:`receive`) makes the effect happen once. Delivery may happen twice; the effect may not.

Five observations stay apart, and none proves the next: a row in ``orders``, an unsent ``outbox`` row, a row in the
sink's ``inbox``, an ACK returned to the publisher, and ``sent`` stored. ``docs/outbox.md`` maps each failure
point to what it leaves behind.

Value rules (as the lease lab): identifiers are exact ``str`` of 1-64 ASCII letters, digits, ``_``, ``-``; integers
are exact ``int`` (no ``bool``); dicts are exact ``dict``. Bad input is ``ValueError`` before any change; inputs are
never mutated; a borrowed connection is never closed and is left with no open transaction, on every path. Every
write runs in ``BEGIN IMMEDIATE``. Importing this module needs only the standard library.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from asyncq.core.ack import verify_ack
from asyncq.core.values import check_event, check_hook, check_identifier, check_int, check_seconds, snapshot
from asyncq.errors import BadAck, Conflict
from asyncq.lab._outbox_http import (
    SinkServer,
    check_bind_host,
    parse_loopback_url,
    post_json,
)
from asyncq.store.sqlite.connection import call_hook, open_file, write_transaction

__all__ = [
    "BadAck",
    "Conflict",
    "SinkServer",
    "accept",
    "dispatch",
    "mark_sent",
    "open_sink",
    "open_source",
    "pending",
    "receive",
    "send_http",
    "serve_sink",
    "validate_event",
]

BATCH_MAX = 16
ACK_STATUSES = ("applied", "duplicate")

# --- the schemas and statements, by name -----------------------------------------------------------
SOURCE_DDL = (
    "CREATE TABLE IF NOT EXISTS orders(id PRIMARY KEY, qty)",
    "CREATE TABLE IF NOT EXISTS outbox(seq INTEGER PRIMARY KEY AUTOINCREMENT, id UNIQUE, qty,"
    " sent INTEGER NOT NULL CHECK(sent IN (0,1)))",
)
SINK_DDL = (
    "CREATE TABLE IF NOT EXISTS inbox(id PRIMARY KEY, qty)",
    "CREATE TABLE IF NOT EXISTS stock(item PRIMARY KEY, qty)",
    "INSERT OR IGNORE INTO stock(item, qty) VALUES ('snack', 0)",
)
ORDER_QTY = "SELECT qty FROM orders WHERE id = ?"
INSERT_ORDER = "INSERT INTO orders(id, qty) VALUES (?, ?)"
INSERT_OUTBOX = "INSERT INTO outbox(id, qty, sent) VALUES (?, ?, 0)"
SELECT_UNSENT = "SELECT id, qty FROM outbox WHERE sent = 0 ORDER BY seq LIMIT ?"
MARK_SENT = "UPDATE outbox SET sent = 1 WHERE id = ? AND sent = 0"
OUTBOX_HAS = "SELECT 1 FROM outbox WHERE id = ?"
INBOX_QTY = "SELECT qty FROM inbox WHERE id = ?"
INSERT_INBOX = "INSERT INTO inbox(id, qty) VALUES (?, ?)"
ADD_STOCK = "UPDATE stock SET qty = qty + ? WHERE item = 'snack'"


def _check_con(con: object) -> sqlite3.Connection:
    """A usable ``sqlite3.Connection`` with no open transaction (it is borrowed, never closed here)."""
    if not isinstance(con, sqlite3.Connection):
        raise ValueError(f"con must be a sqlite3.Connection, not {type(con).__name__}")
    try:
        busy = con.in_transaction
    except sqlite3.ProgrammingError as exc:
        raise ValueError("con is closed") from exc
    if busy:
        raise ValueError("con already has an open transaction")
    return con


def _rows(con: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
    """Run one statement to completion as plain tuples, whatever the caller's ``row_factory``."""
    cursor = con.cursor()
    try:
        cursor.row_factory = None
        return list(cursor.execute(sql, params).fetchall())
    finally:
        cursor.close()


def validate_event(event: object) -> dict[str, Any]:
    """An exact dict with only ``id`` (identifier) and ``qty`` (int 1-1000); returns a new dict, else ``ValueError``."""
    return check_event(event)


def open_source(path: object) -> sqlite3.Connection:
    """The intake store: ``orders`` and ``outbox`` created only if missing, in one transaction.

    Autocommit (``isolation_level=None``), busy timeout 1 s, ``journal_mode=DELETE``, ``synchronous=FULL``;
    the connection is closed if initialisation fails."""
    return open_file(path, SOURCE_DDL, journal_mode="DELETE", synchronous="FULL")


def open_sink(path: object) -> sqlite3.Connection:
    """The warehouse store: ``inbox`` and ``stock`` (one row ``('snack', 0)``, inserted only if missing).

    Same settings as :func:`open_source` except ``synchronous=EXTRA``: the receiver ACKs on commit, and in
    DELETE mode only EXTRA also syncs the directory after the journal is deleted."""
    return _open_sink(path, check_same_thread=True)


def _open_sink(path: object, *, check_same_thread: bool) -> sqlite3.Connection:
    return open_file(path, SINK_DDL, journal_mode="DELETE", synchronous="EXTRA", check_same_thread=check_same_thread)


def accept(con: sqlite3.Connection, event: dict[str, Any]) -> bool:
    """Atomic intake: the order row and its outbox row (``sent=0``) in one write transaction → ``True``.

    The same id and qty again → ``False`` with no change; the same id with another qty → ``Conflict``."""
    con = _check_con(con)
    checked = validate_event(event)
    with write_transaction(con):
        found = _rows(con, ORDER_QTY, (checked["id"],))
        if found:
            if found[0][0] != checked["qty"]:
                raise Conflict(f"order {checked['id']!r} exists with another qty")
            return False
        con.execute(INSERT_ORDER, (checked["id"], checked["qty"]))
        con.execute(INSERT_OUTBOX, (checked["id"], checked["qty"]))
    return True


def pending(con: sqlite3.Connection, limit: int = BATCH_MAX) -> list[dict[str, Any]]:
    """Up to ``limit`` (int 1-16) unsent items as ``[{'id', 'qty'}]`` in outbox ``seq`` order.

    Never id order or time order: insertion order. Reads only; the read is finished before returning."""
    con = _check_con(con)
    count = check_int(limit, "limit", 1, BATCH_MAX)
    return [{"id": item_id, "qty": qty} for item_id, qty in _rows(con, SELECT_UNSENT, (count,))]


def mark_sent(con: sqlite3.Connection, event_id: str) -> bool:
    """Store ``sent=1`` for ``event_id``: ``True`` if this changed the row, ``False`` if it was already sent.

    An unknown id is ``ValueError`` (nothing changes)."""
    con = _check_con(con)
    item_id = check_identifier(event_id, "event_id")
    with write_transaction(con):
        if con.execute(MARK_SENT, (item_id,)).rowcount == 1:
            return True
        if not _rows(con, OUTBOX_HAS, (item_id,)):
            raise ValueError(f"event_id {item_id!r} is not in the outbox")
    return False


def receive(con: sqlite3.Connection, event: dict[str, Any]) -> str:
    """Sink side: a new id → inbox row and ``stock += qty`` in one write transaction → ``'applied'``.

    The same id and qty → ``'duplicate'`` with no change; the same id with another qty → ``Conflict``."""
    con = _check_con(con)
    checked = validate_event(event)
    with write_transaction(con):
        found = _rows(con, INBOX_QTY, (checked["id"],))
        if found:
            if found[0][0] != checked["qty"]:
                raise Conflict(f"inbox {checked['id']!r} holds another qty")
            return "duplicate"
        con.execute(INSERT_INBOX, (checked["id"], checked["qty"]))
        if con.execute(ADD_STOCK, (checked["qty"],)).rowcount != 1:
            raise sqlite3.IntegrityError("the stock row 'snack' is missing")
    return "applied"


def dispatch(
    con: sqlite3.Connection,
    send: Callable[[dict[str, Any]], object],
    limit: int = BATCH_MAX,
    fault: Callable[[str], object] | None = None,
) -> int:
    """Send one :func:`pending` batch in order and mark each item sent after its ACK; return how many.

    For each item: ``send(copy)`` with no transaction open (only an exact ``True`` counts, any other return is
    ``BadAck``), then ``fault('after-delivery')``, then :func:`mark_sent` with the id selected from the outbox,
    never the copy's. The first failure stops the batch and propagates unchanged: earlier items stay sent, the
    failing and later ones stay unsent, and the next call resumes with the failing one."""
    con = _check_con(con)
    if not callable(send):
        raise ValueError("send must be callable")
    hook = check_hook(fault)
    batch = pending(con, limit)
    for done, item in enumerate(batch):
        answer = send(snapshot(item))
        if answer is not True:
            raise BadAck(f"send returned {answer!r} for {item['id']!r}, not True ({done} marked sent)")
        call_hook(hook, "after-delivery")
        mark_sent(con, item["id"])
    return len(batch)


def send_http(url: str, event: dict[str, Any], timeout: float = 2.0) -> bool:
    """POST ``{"id", "qty"}`` as JSON to a loopback ``/events`` URL and verify the ACK; return ``True``.

    ``url`` must be ``http://`` + (127.0.0.0/8 dotted quad | ``localhost`` | ``[::1]``) + optional port + exactly
    ``/events`` (no userinfo, query, fragment or encoded characters), else ``ValueError`` before any I/O, as for
    a bad ``event`` or a ``timeout`` that is not a positive finite int/float. ``timeout`` bounds the whole
    exchange. Proxy variables are ignored and redirects never followed. Only status 200 with a JSON object (at
    most 4096 bytes) whose ``id`` is the event's id and whose ``status`` is ``applied`` or ``duplicate`` is an
    ACK; anything else is ``BadAck``. Network errors and timeouts propagate."""
    target = parse_loopback_url(url)
    checked = validate_event(event)
    seconds = check_seconds(timeout, "timeout")
    verify_ack(checked["id"], post_json(target, checked, seconds), ACK_STATUSES)
    return True


def serve_sink(path: object, host: str = "127.0.0.1", port: int = 0) -> SinkServer:
    """Start a real HTTP receiver for ``POST /events`` over :func:`open_sink` + :func:`receive`.

    200 ``{"id", "status"}`` for applied or duplicate, 409 for a conflict, 400 for malformed or invalid JSON
    (nothing changes), 413 for bodies over 4096 bytes, 404 for other paths, 405 for other methods on
    ``/events`` (503 if the store is busy). Returns a :class:`SinkServer` with ``port``, ``url``,
    ``requests``, ``log`` and ``close()``; ``port=0`` picks a free port."""
    bind_host = check_bind_host(host)
    bind_port = check_int(port, "port", 0, 65535)
    con = _open_sink(path, check_same_thread=False)  # used by handler threads, one at a time under a lock
    try:
        return SinkServer(bind_host, bind_port, apply=lambda event: receive(con, event), close_store=con.close)
    except BaseException:
        con.close()
        raise
