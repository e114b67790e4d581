"""Which store a target names: a ``postgresql://`` (or ``postgres://``) URL is PostgreSQL (``asyncq[postgres]``);
anything else is a path to a SQLite file. The one place the facades reach a driver from."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Sequence

from asyncq.store.port.amqp import AmqpStore, DeadMessage
from asyncq.store.port.inbox import InboxStore, InboxTotals
from asyncq.store.port.outbox import OutboxStore
from asyncq.store.port.queue import QueueStore, StoreState, is_store_url

#: The durability levels a PostgreSQL store takes: it always commits with ``synchronous_commit=on`` (``None``: keep
#: what the store has, which is the same).
POSTGRES_DURABILITY = ("full", None)


async def open_queue_store(
    target: object, *, durability: str | None, busy_timeout: float, read_only: bool
) -> QueueStore:
    """The queue store ``target`` names, open (created and migrated unless ``read_only``)."""
    if is_store_url(target):
        _check_durability(durability)
        _check_asyncpg()
        from asyncq.store.postgres.queue_store import PostgresQueueStore

        return await PostgresQueueStore.open(target, read_only=read_only)
    if not isinstance(target, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, not {type(target).__name__}")
    from asyncq.store.sqlite.queue_store import SqliteQueueStore  # the driver loads aiosqlite

    return await SqliteQueueStore.open(target, durability=durability, busy_timeout=busy_timeout, read_only=read_only)


async def inspect_queue_store(target: object, *, busy_timeout: float) -> StoreState:
    """What ``target`` holds, found without creating or changing it (``Queue.inspect``)."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.inspection import inspect_url

        return await inspect_url(target)
    if not isinstance(target, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, not {type(target).__name__}")
    from asyncq.store.sqlite.admin import inspect_target

    return await asyncio.to_thread(inspect_target, target, busy_timeout)


def _check_asyncpg() -> None:
    """The PostgreSQL driver runs on asyncpg, an extra: say how to install it rather than fail on an import."""
    if importlib.util.find_spec("asyncpg") is None:
        raise ImportError("a postgresql:// store needs asyncpg: pip install 'asyncq[postgres]'")


def store_target(target: object, name: str = "path") -> str:
    """``target`` as the text a store is opened from, checked before anything opens: a ``postgresql://`` URL
    (``ValueError`` naming what is wrong with it) or a path to a local SQLite file."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.connection import parse_url

        parse_url(target)
        assert isinstance(target, str)
        return target
    return store_path(target, name)


def store_path(target: object, name: str = "path") -> str:
    """``target`` as the path of a SQLite file, checked before anything opens (``ValueError`` for what is not a path
    to a local file); a caller has ruled out a store URL."""
    from asyncq.store.sqlite.connection import check_path

    return check_path(target, name)


def _check_durability(durability: str | None) -> None:
    if durability not in POSTGRES_DURABILITY:
        raise ValueError(
            f"durability {durability!r} is a SQLite file's setting: a PostgreSQL store always commits with"
            " synchronous_commit=on (durability 'full')"
        )


async def open_inbox_store(target: object, *, ddl: Sequence[str] = ()) -> InboxStore:
    """The inbox store ``target`` names, open: its tables and the effect's ``ddl`` created if missing."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.inbox import PostgresInboxStore

        return await PostgresInboxStore.open(target, ddl=ddl)
    from asyncq.store.sqlite.inbox import SqliteInboxStore

    return await SqliteInboxStore.open(store_path(target, "db"), ddl=ddl)


async def open_outbox_store(target: object, *, durability: str, busy_timeout: float) -> OutboxStore:
    """The outbox store ``target`` names, open (its tables created if missing, beside the app's own)."""
    if is_store_url(target):
        _check_durability(durability)
        _check_asyncpg()
        from asyncq.store.postgres.outbox import PostgresOutboxStore

        return await PostgresOutboxStore.open(target)
    from asyncq.store.sqlite.outbox import SqliteOutboxStore

    return await SqliteOutboxStore.open(store_path(target), durability=durability, busy_timeout=busy_timeout)


async def open_amqp_store(target: object, *, connections: int) -> AmqpStore:
    """The AMQP consumer's store ``target`` names, open for ``connections`` concurrent deliveries (its tables
    created if missing)."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.amqp import PostgresAmqpStore

        return await PostgresAmqpStore.open(target, connections=connections)
    from asyncq.store.sqlite.amqp import SqliteAmqpStore

    return await SqliteAmqpStore.open(store_path(target, "database"), connections=connections)


def read_dead_messages(target: object) -> list[DeadMessage]:
    """The AMQP consumer's parked messages in the store ``target`` names, read synchronously (for an operator's
    script; the consumer's tables are created if missing)."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.amqp import read_dead_of_url

        return read_dead_of_url(target)
    from asyncq.store.sqlite.amqp import read_dead

    return read_dead(store_path(target, "database"))


async def read_inbox_totals(target: object, *, timeout: float) -> InboxTotals:
    """A receiver's durable counts read-only from the inbox store ``target`` names (``StoreError`` if it is
    missing or not an inbox; nothing is created or changed)."""
    if is_store_url(target):
        _check_asyncpg()
        from asyncq.store.postgres.inbox import read_totals_of_url

        return await read_totals_of_url(target)
    from asyncq.store.sqlite.inbox import read_totals_of_file

    return await asyncio.to_thread(read_totals_of_file, store_path(target, "db"), timeout)
