"""``EffectTransaction`` on a ``sqlite3`` connection: what the inbox's and the AMQP consumer's effects are handed
(and how an app's statement runs inside ``Queue.transaction()`` and ``Outbox.transaction()``).

The effect's statements run on the store's connection, inside its write transaction, in its thread. While the
effect runs, an authorizer refuses every statement that would end that transaction (``BEGIN``, ``COMMIT``,
``END``, ``ROLLBACK``) or touch one of asyncq's savepoints (named ``asyncq…``): SQLite checks them as they are
prepared, cached ones included. So an effect can neither commit half an event nor release the inbox's savepoint,
and an app's block can neither commit early nor be left half committed; savepoints of its own are fine.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncq.store.port.effects import Parameters

#: The prefix of asyncq's own savepoints, which an effect may not release or roll back to.
SAVEPOINT_PREFIX = "asyncq"


class SqliteEffectTransaction:
    """The store's open write transaction on ``con``, for one effect: usable only while the effect runs."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con
        self._open = True
        self._refused = False

    def execute(self, statement: str, parameters: Parameters = ()) -> list[Any]:
        """Run one statement of the app's own inside the transaction and return its rows."""
        if not self._open:
            raise RuntimeError("the effect has returned: its transaction is no longer usable")
        self._refused = False
        try:
            return self._con.execute(statement, parameters).fetchall()
        except sqlite3.DatabaseError as error:
            if self._refused:
                raise RuntimeError(
                    "refused: a statement inside asyncq's transaction cannot commit or roll it back, nor use asyncq's "
                    "savepoints (asyncq ends the transaction itself)"
                ) from error
            raise

    def _authorize(self, action: int, operation: str | None, name: str | None, *_where: str | None) -> int:
        ours = action == sqlite3.SQLITE_SAVEPOINT and (name or "").lower().startswith(SAVEPOINT_PREFIX)
        if action == sqlite3.SQLITE_TRANSACTION or ours:
            self._refused = True
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


@contextmanager
def effect_transaction(con: sqlite3.Connection) -> Iterator[SqliteEffectTransaction]:
    """An ``EffectTransaction`` on ``con`` for the duration of the block (``con`` must be in a transaction)."""
    tx = SqliteEffectTransaction(con)
    con.set_authorizer(tx._authorize)
    try:
        yield tx
    finally:
        tx._open = False
        con.set_authorizer(None)
