"""``PostgresInboxStore``: the inbox store's port on PostgreSQL (``asyncq.store.port.inbox`` states the rules).

One batch is one transaction on a pooled connection, committed with ``synchronous_commit=on`` before ``record``
returns. An event with an effect runs in a savepoint of its own (``inbox_event``, as on SQLite): its inbox row and
every row its effect wrote are rolled back together if the effect raises. The effect is a synchronous function
as on SQLite; it runs in the store's effect thread and its statements run on the batch's connection
(``effect_thread``).

**Once per id across hosts.** A new id is claimed by ``INSERT … ON CONFLICT (id) DO NOTHING``: a receiver on
another host inserting the same id waits for the first one's transaction, then finds the row (a duplicate) if it
committed, or inserts it itself if it rolled back (a receiver killed mid-effect leaves nothing: the server rolls
its transaction back when the connection drops).

**No deadlock between crossing batches.** Two batches holding the same ids in opposite orders would each wait for
the other's row. So a batch first takes a transaction-level advisory lock per id (``LOCK_IDS``), in the order of
the lock keys, in one statement: a batch that meets another waits for it whole, and the effects still run in the
batch's own order. An effect whose own rows cross another batch's can still deadlock (or meet a serialisation
failure): the server breaks it and the batch, rolled back whole, is run again (``RETRIES`` times) before its
events are answered as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg
from asyncpg import exceptions

from asyncq.errors import StoreError
from asyncq.store.port.inbox import InboxEffect, InboxEvent, InboxResult, InboxTotals
from asyncq.store.postgres.connection import (
    Connection,
    Migrations,
    Target,
    advisory_key,
    connect,
    parse_url,
    read_version,
)
from asyncq.store.postgres.effect_thread import EffectThread
from asyncq.store.postgres.failures import PostgresBusy
from asyncq.store.postgres.pooled import PooledStore, one_row, raise_translated

log = logging.getLogger("asyncq.store.postgres.inbox")

ROLLED_BACK = (exceptions.DeadlockDetectedError, exceptions.SerializationError)  # nothing of the batch is left

INBOX = Migrations(
    component="inbox",
    steps=(
        (
            """CREATE TABLE {schema}.inbox (
  id text PRIMARY KEY,
  body text NOT NULL,
  applied_at_ms bigint NOT NULL,
  duplicates integer NOT NULL DEFAULT 0,
  conflicts integer NOT NULL DEFAULT 0
)""",
        ),
    ),
)

INSERT_EVENT = """INSERT INTO {s}.inbox (id, body, applied_at_ms) VALUES ($1, $2, $3)
ON CONFLICT (id) DO NOTHING RETURNING true"""
# A known id: a duplicate if its canonical body is the same, else a conflict; true for a duplicate.
COUNT_REPEAT = """UPDATE {s}.inbox
SET duplicates = duplicates + (body = $2)::int, conflicts = conflicts + (body <> $2)::int
WHERE id = $1 RETURNING body = $2"""
TOTALS = "SELECT count(*), coalesce(sum(duplicates), 0), coalesce(sum(conflicts), 0) FROM {s}.inbox"
# One lock per distinct id, keyed in the schema's inbox, taken in key order (released at commit or rollback).
LOCK_IDS = """SELECT count(pg_advisory_xact_lock(key)) FROM (
  SELECT DISTINCT hashtextextended($2 || ':' || id, 0) AS key FROM unnest($1::text[]) AS id ORDER BY key
) AS keys"""
RETRIES = 3  # runs of a batch the server rolled back (a deadlock broken, a serialisation failure)
RELEASE = "RELEASE inbox_event"
ROLL_BACK = "ROLLBACK TO inbox_event; RELEASE inbox_event"


async def _record_event(conn: Connection, schema: str, event: InboxEvent, now_ms: int) -> str | None:
    """The event's row if its id is new (``None``: the effect is to run), else the repeat counted."""
    if await conn.fetchval(INSERT_EVENT.format(s=schema), event.id, event.canonical, now_ms):
        return None
    same = await conn.fetchval(COUNT_REPEAT.format(s=schema), event.id, event.canonical)
    return "duplicate" if same else "conflict"


class PostgresInboxStore(PooledStore):
    """The inbox store's port on PostgreSQL. Open with ``await PostgresInboxStore.open(url, ddl=…)``."""

    def __init__(self, target: Target, pool: asyncpg.Pool) -> None:
        super().__init__(target, pool)
        self._effects = EffectThread("asyncq-inbox-effect")

    @classmethod
    async def open(cls, url: object, *, ddl: Sequence[str] = ()) -> PostgresInboxStore:
        """Open the inbox of the schema the URL names (created and migrated if needed), then run ``ddl`` (the
        effect's own ``CREATE … IF NOT EXISTS``, in the app's dialect and ``search_path``) in one transaction
        under the same advisory lock, so that hosts starting at once do not race to create the same table."""
        statements = tuple(ddl)

        async def run_ddl(conn: Connection, schema: str) -> None:
            if statements:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", advisory_key(schema))
                    for statement in statements:
                        await conn.execute(statement)

        return cls(*await cls.open_target(url, INBOX, run_ddl))

    async def record(self, events: Sequence[InboxEvent], now_ms: int, effect: InboxEffect | None) -> list[InboxResult]:
        for run in range(1, RETRIES + 1):
            try:
                results: list[InboxResult] = await self._write(self._record_events, events, now_ms, effect)
            except PostgresBusy as error:
                if run == RETRIES or not isinstance(error.__cause__, ROLLED_BACK):
                    raise
                log.info("inbox batch of %d rolled back by the server (%s): run %d of %d", len(events), error, run + 1,
                         RETRIES)  # fmt: skip
                continue
            return results
        raise AssertionError("unreachable")

    async def _record_events(
        self, conn: Connection, schema: str, events: Sequence[InboxEvent], now_ms: int, effect: InboxEffect | None
    ) -> list[InboxResult]:
        """Every event in the caller's transaction; with an effect, each in its savepoint (an event whose effect
        raises is rolled back alone and gets its exception; one that cannot be rolled back fails the batch)."""
        results: list[InboxResult] = []
        await conn.fetchval(LOCK_IDS, [event.id for event in events], f"{schema}.inbox")
        for event in events:
            if effect is None:
                results.append(await _record_event(conn, schema, event, now_ms) or "applied")
                continue
            await conn.execute("SAVEPOINT inbox_event")
            try:
                found = await _record_event(conn, schema, event, now_ms)
                if found is None:
                    await self._effects.run(conn, effect, event.id, event.body)
                await conn.execute(RELEASE)
            except Exception as error:
                await conn.execute(ROLL_BACK)
                results.append(error)
                continue
            results.append(found or "applied")
        return results

    async def totals(self) -> InboxTotals:
        async def read(conn: Connection, schema: str) -> InboxTotals:
            return InboxTotals(*await one_row(conn, TOTALS.format(s=schema)))

        totals: InboxTotals = await self._run(read)
        return totals

    async def close(self) -> None:
        await super().close()
        self._effects.close()


async def read_totals_of_url(url: object) -> InboxTotals:
    """The durable counts of the inbox the URL names, on a read-only connection of its own: ``StoreError`` if the
    schema holds no inbox (nothing is created or changed)."""
    target = parse_url(url)
    conn = await connect(target, read_only=True)
    try:
        if not await read_version(conn, target.schema, INBOX.component):
            raise StoreError(f"{target.location} is not an asyncq inbox (schema {target.schema} has no inbox tables)")
        return InboxTotals(*await one_row(conn, TOTALS.format(s=target.schema)))
    except Exception as error:
        raise_translated(error, target.location)
    finally:
        await conn.close()
