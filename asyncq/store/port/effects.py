"""The effect interface: what a user's effect (the inbox's, the AMQP consumer's) is handed instead of a driver's
connection.

An effect runs synchronously inside the store's write transaction, in the thread that owns the store's
connection (the inbox's writer, a consumer's connection thread; on PostgreSQL the store's effect thread, each
statement sent to the connection's event loop): it writes the app's own rows with ``execute``, and those rows
commit together with asyncq's (the inbox row, the completion key) or not at all. An effect never ends the
transaction itself: a store refuses a statement that would commit, roll back or release it, and the whole event
is rolled back. The statements are in the store's own dialect, which ``dialect`` names: ``sqlite`` (``?`` and
``:name`` placeholders) or ``postgresql`` (``$1``, ``$2`` … from a list or tuple).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

#: A statement's parameters: positional (``?``, ``$1``) or named (``:name``, SQLite only).
Parameters = Sequence[Any] | Mapping[str, Any]


class EffectTransaction(Protocol):
    """The store's open write transaction, as a user's effect sees it. Usable only while the effect runs."""

    #: The SQL the store speaks: ``"sqlite"`` or ``"postgresql"`` (an effect written for both picks its statements).
    dialect: str

    def execute(self, statement: str, parameters: Parameters = ()) -> list[Any]:
        """Run one statement of the app's own inside the transaction and return its rows (tuples)."""
        ...
