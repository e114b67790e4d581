"""A user's synchronous effect (``asyncq.store.port.effects``) on an asyncpg transaction.

An effect is a plain function that calls ``tx.execute(…)`` and gets rows back, as on SQLite; asyncpg's calls are
coroutines of the event loop that owns the connection. So the effect runs in a thread of the store's own (it
may block there without stalling the loop), and each of its statements is sent to the loop and run on the
connection inside the store's open transaction, while the store's coroutine waits for the effect to return.
The connection is used by one call at a time: the store does nothing else on it until the effect has ended,
even when the waiting task is cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asyncq.store.port.effects import EffectTransaction, Parameters
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.effects import execute_inside


class PostgresEffectTransaction:
    """The store's open transaction on a connection, for one effect running in the effect thread; usable only
    while the effect runs. Statements take ``$1``-style parameters from a list or tuple."""

    dialect = "postgresql"

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._open = True

    def execute(self, statement: str, parameters: Parameters = ()) -> list[Any]:
        """Run one statement of the app's own inside the transaction and return its rows (tuples)."""
        if not self._open:
            raise RuntimeError("the effect has returned: its transaction is no longer usable")
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("an effect's statements run from the effect's own thread, not the event loop's")
        future = asyncio.run_coroutine_threadsafe(execute_inside(self._conn, statement, parameters), self._loop)
        return future.result()

    def close(self) -> None:
        self._open = False


class EffectThread:
    """The threads where a store runs its effects: ``workers`` at a time (one by default), each on the connection
    of the transaction it was given."""

    def __init__(self, name: str, *, workers: int = 1) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, conn: Connection, effect: Callable[..., object], *args: Any) -> None:
        """``effect(tx, *args)`` in the thread, ``tx`` an ``EffectTransaction`` on ``conn``; its exception is
        raised here. Cancelled, it still waits for the effect to end (its later statements are refused)."""
        loop = asyncio.get_running_loop()
        tx = PostgresEffectTransaction(conn, loop)
        done = loop.run_in_executor(self._executor, _call, effect, tx, args)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            tx.close()
            await asyncio.wait([done])
            raise
        finally:
            tx.close()

    def close(self) -> None:
        """Let the thread end once the effect in progress (if any) has returned."""
        self._executor.shutdown(wait=False)


def _call(effect: Callable[..., object], tx: EffectTransaction, args: tuple[Any, ...]) -> None:
    effect(tx, *args)
