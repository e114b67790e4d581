"""The one seam between asyncio and the synchronous engine.

A whole engine transaction runs as one call in the aiosqlite connection's own thread: one thread hop
per transaction (≈ 55-60 µs here) instead of one per statement, and no await can land inside
``BEGIN IMMEDIATE … COMMIT``. If the awaiting task is cancelled, the call still runs to its end in that
thread (commit or rollback), so a cancellation never leaves a lock behind; its outcome is then unknown
to the caller and must be read back from the row (``Queue.reconcile``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, cast

import aiosqlite

T = TypeVar("T")


async def run_sync(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sqlite3_connection, *args)`` in ``conn``'s thread, after everything queued before it."""
    raw: sqlite3.Connection = conn._conn  # aiosqlite keeps the sqlite3 connection private; reading it is safe
    return cast(T, await conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]
