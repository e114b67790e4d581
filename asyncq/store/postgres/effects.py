"""Running an app's own statement inside a transaction asyncq holds on PostgreSQL (``Queue.transaction()``'s
``execute``; the inbox's and the outbox's effects on this store can use the same).

A statement runs through asyncpg's extended protocol (``fetch``), which takes exactly one statement, so the
check is exact: a statement that would begin, commit, roll back or prepare the transaction starts with its
keyword after nothing but whitespace, semicolons and comments, and is refused before it runs. Savepoints
(``SAVEPOINT``, ``ROLLBACK TO``, ``RELEASE``) are the app's to use. Parameters are positional (``$1``, ``$2``…).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from asyncq.store.postgres.connection import Connection

# Possessive (``*+``): a comment is skipped whole, never re-read as the keyword it contains.
_LEADING = r"(?:\s|;|--[^\n]*+|/\*(?:[^*]|\*(?!/))*+(?:\*/|\Z))*+"
_ENDS_TRANSACTION = re.compile(
    _LEADING
    + r"(?:BEGIN|START\s+TRANSACTION|COMMIT|END|ABORT|PREPARE\s+TRANSACTION"
    + r"|ROLLBACK(?!\s+(?:WORK\s+|TRANSACTION\s+)?TO\b))\b",
    re.IGNORECASE | re.DOTALL,
)
REFUSED = "refused: a statement inside asyncq's transaction cannot begin, commit or roll it back (asyncq ends it)"


def ends_transaction(statement: str) -> bool:
    """Whether ``statement`` would begin, commit or roll back a transaction (``ROLLBACK TO`` a savepoint does not)."""
    return _ENDS_TRANSACTION.match(statement) is not None


async def execute_inside(conn: Connection, statement: object, parameters: object) -> list[tuple[Any, ...]]:
    """Run one statement of the app's on ``conn``, inside its open transaction, and return its rows as tuples;
    ``RuntimeError`` (before it runs) for one that would end the transaction, ``TypeError`` for parameters that
    are not a sequence."""
    if type(statement) is not str:
        raise TypeError(f"statement must be a str, not {type(statement).__name__}")
    if isinstance(parameters, Mapping | str | bytes) or not isinstance(parameters, Sequence):
        raise TypeError("PostgreSQL statements take positional parameters ($1, $2 …) as a list or tuple")
    if ends_transaction(statement):
        raise RuntimeError(REFUSED)
    rows = await conn.fetch(statement, *parameters)
    if not conn.is_in_transaction():
        raise RuntimeError("the statement ended the transaction: let asyncq commit or roll it back")
    return [tuple(row) for row in rows]
