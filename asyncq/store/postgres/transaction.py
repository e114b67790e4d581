"""``PostgresTransaction``: a transaction open on a connection (the store's pooled one in ``transaction()``, or the
app's own asyncpg connection) in which the app's statements and asyncq's jobs commit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncq.core.dependencies import Ripple
from asyncq.core.groups import Group
from asyncq.core.jobs import Enqueued, NewJob
from asyncq.store.postgres import transitions
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.effects import execute_inside
from asyncq.store.postgres.graph_store import seal_in_transaction
from asyncq.store.postgres.statements import NOTIFY

if TYPE_CHECKING:
    from asyncq.store.postgres.queue_store import PostgresQueueStore


class PostgresTransaction:
    """An open transaction on a connection (the store's, or the app's own): the app's SQL and its jobs commit
    together. Usable only while its block is open."""

    def __init__(self, store: PostgresQueueStore, conn: Connection) -> None:
        self._store = store
        self._conn = conn
        self._open = True
        #: How many jobs asyncq added in this transaction (this process's waiters are woken after the commit).
        self.added = 0

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own (``$1``-style parameters) and return its rows as tuples."""
        self._check_open()
        return await execute_inside(self._conn, statement, parameters)

    async def enqueue_rows(self, rows: Sequence[NewJob]) -> list[Enqueued]:
        """Insert jobs inside this transaction, the batch in a savepoint: a ``Conflict`` takes back this batch
        only (the block may catch it and go on)."""
        self._check_open()
        async with self._conn.transaction():
            added = await transitions.enqueue_rows(self._conn, self._store.schema, rows)
            if True in added and not self.added:  # the transaction's first jobs: its one NOTIFY
                await self._conn.execute(NOTIFY, self._store.wakeups.channel)
        self.added += sum(result is True for result in added)
        return added

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        """Seal a group inside this transaction, in a savepoint (``QueueStore.seal_group``)."""
        self._check_open()
        ripple = Ripple()
        async with self._conn.transaction():
            found = await seal_in_transaction(self._conn, self._store.schema, name, callback, now_ms, ripple)
        self.added += ripple.released  # a callback released now wakes this process's workers after the commit
        return found

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("this transaction's block has ended: open a new one with transaction()")
