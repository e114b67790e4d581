"""What a PostgreSQL URL's schema holds, found without creating or changing anything (``Queue.inspect``), and
whether a read-only handle may open it."""

from __future__ import annotations

from asyncq.errors import StoreError
from asyncq.store.port.queue import StoreState
from asyncq.store.postgres.connection import (
    Connection,
    Target,
    connect,
    parse_url,
    read_version,
    schema_exists,
    settings,
)
from asyncq.store.postgres.schema import QUEUE, SCHEMA_VERSION


async def check_reader(conn: Connection, target: Target) -> None:
    """A reader opens only a current queue (an older one is migrated by a writer's open, ``asyncq init``)."""
    version = await read_version(conn, target.schema, QUEUE.component)
    if not version:
        raise StoreError(f"{target.location} is not an asyncq queue (schema {target.schema} has no queue tables)")
    if version > SCHEMA_VERSION:
        raise StoreError(f"{target.location} has schema version {version}, newer than this asyncq's")
    if version < SCHEMA_VERSION:
        raise StoreError(f"{target.location} has schema version {version}: run `asyncq init` to migrate it")


async def inspect_url(url: object) -> StoreState:
    """What the URL's schema holds, found without creating or changing anything (``Queue.inspect``)."""
    target = parse_url(url)
    conn = await connect(target)
    try:
        version = await read_version(conn, target.schema, QUEUE.component)
        if not await schema_exists(conn, target.schema):
            kind = "missing"
        elif version:
            kind = "queue"
        else:
            tables = await conn.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'versions'", target.schema
            )
            kind = "other" if tables else "empty"
        found = {"schema": target.schema, **await settings(conn, ("synchronous_commit", "server_version"))}
    finally:
        await conn.close()
    return StoreState(target.location, kind, version or 0, SCHEMA_VERSION, found, store="postgresql")
