"""``EffectTransaction`` on a ``sqlite3`` connection: what the inbox's and the AMQP consumer's effects are handed
(and how an app's statement runs inside ``Queue.transaction()`` and ``Outbox.transaction()``).

The effect's statements run on the store's connection, inside its write transaction, in its thread. A statement
that would end that transaction (``BEGIN``, ``COMMIT``, ``END``, ``ROLLBACK`` of the transaction) is refused
before it runs: an effect can neither commit half an event nor leave the rest of a batch in autocommit, and an
app's block can neither commit early nor be left half committed. SQLite's grammar makes the check exact: such a
statement starts with its keyword, after nothing but whitespace, semicolons and comments, and ``sqlite3`` runs
one statement per call. (An authorizer would do it too, but setting one expires every cached statement: about
130 µs a transaction, measured.) Savepoints are the effect's to use; releasing the inbox's makes its whole batch
fail and roll back, which is safe: every event of it is answered as failed and sent again.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncq.store.port.effects import Parameters

# Possessive (``*+``): a comment is skipped whole, never re-read as the keyword it contains.
_LEADING = r"(?:\s|;|--[^\n]*+|/\*(?:[^*]|\*(?!/))*+(?:\*/|\Z))*+"
_ENDS_TRANSACTION = re.compile(
    _LEADING + r"(?:BEGIN|COMMIT|END|ROLLBACK(?!\s+(?:TRANSACTION\s+)?TO\b))\b", re.IGNORECASE | re.DOTALL
)
REFUSED = "refused: a statement inside asyncq's transaction cannot begin, commit or roll it back (asyncq ends it)"


def ends_transaction(statement: str) -> bool:
    """Whether ``statement`` would begin, commit or roll back a transaction (``ROLLBACK TO`` a savepoint does not)."""
    return _ENDS_TRANSACTION.match(statement) is not None


class SqliteEffectTransaction:
    """The store's open write transaction on ``con``, for one effect: usable only while the effect runs."""

    dialect = "sqlite"

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con
        self._open = True

    def execute(self, statement: str, parameters: Parameters = ()) -> list[Any]:
        """Run one statement of the app's own inside the transaction and return its rows."""
        if not self._open:
            raise RuntimeError("the effect has returned: its transaction is no longer usable")
        if type(statement) is str and ends_transaction(statement):
            raise RuntimeError(REFUSED)
        rows = self._con.execute(statement, parameters).fetchall()
        if not self._con.in_transaction:  # SQLite rolled back by itself (disk full, I/O error)
            raise RuntimeError("the statement ended the transaction: let asyncq commit or roll it back")
        return rows


@contextmanager
def effect_transaction(con: sqlite3.Connection) -> Iterator[SqliteEffectTransaction]:
    """An ``EffectTransaction`` on ``con`` (inside its write transaction) for the duration of the block."""
    tx = SqliteEffectTransaction(con)
    try:
        yield tx
    finally:
        tx._open = False
