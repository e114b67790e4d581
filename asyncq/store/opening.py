"""Which store a target names: a ``postgresql://`` URL would be PostgreSQL (not yet a store here); anything else
is a path to a SQLite file. The one place the facades reach a driver from."""

from __future__ import annotations

import asyncio
import os

from asyncq.store.port.queue import QueueStore, StoreState

URL_SCHEMES = ("postgresql://", "postgres://")


async def open_queue_store(
    target: object, *, durability: str | None, busy_timeout: float, read_only: bool
) -> QueueStore:
    """The queue store ``target`` names, open (created and migrated unless ``read_only``)."""
    if isinstance(target, str) and target.startswith(URL_SCHEMES):
        raise ValueError("asyncq has no PostgreSQL store yet: give a path to a SQLite file")
    if not isinstance(target, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, not {type(target).__name__}")
    from asyncq.store.sqlite.queue_store import SqliteQueueStore  # the driver loads aiosqlite

    return await SqliteQueueStore.open(target, durability=durability, busy_timeout=busy_timeout, read_only=read_only)


async def inspect_queue_store(target: object, *, busy_timeout: float) -> StoreState:
    """What ``target`` holds, found without creating or changing it (``Queue.inspect``)."""
    if isinstance(target, str) and target.startswith(URL_SCHEMES):
        raise ValueError("asyncq has no PostgreSQL store yet: give a path to a SQLite file")
    if not isinstance(target, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, not {type(target).__name__}")
    from asyncq.store.sqlite.admin import inspect_target

    return await asyncio.to_thread(inspect_target, target, busy_timeout)
