"""``PostgresOutboxStore``: the outbox store's port on PostgreSQL (``asyncq.store.port.outbox`` draws the edges
an item moves along). Its tables (``outbox_schema``) live in the store's schema beside the queue's, migrated as
component ``outbox``.

**Order across hosts.** Items are delivered in ``seq`` order, so ``seq`` order must be commit order: an item
whose number is lower but whose transaction commits later would otherwise be found after its successor was
sent. Every add therefore first takes a transaction-scoped advisory lock of the schema's outbox (``ORDER_LOCK``)
and then numbers its item ``max(seq) + 1`` in a statement of its own (so that it sees the last holder's commit):
transactions that add items commit one after the other, from their first add to their commit, as writers of a
SQLite file do, and numbers have no gaps. The lock is the price of order: add items late in a long transaction.

**Relay writes are one statement each.** Starting an attempt, marking sent and recording a failure run in one
statement with the renewal of the relay's lease (data-modifying ``WITH``): the renewal locks the lease row by
owner and token, the item updates happen only if it matched, and a takeover waits for that row until the
statement commits. One round trip a step, fenced exactly as SQLite's transaction.

**Relays woken across hosts.** A transaction that adds items sends one ``NOTIFY`` on the outbox's channel (in the
statement that inserts its first item; delivered at commit), and a relay's wait listens for it (``Wakeups``, the
queue's mechanism): another host's events are sent at once, and by polling (``poll_ms``) if the listening
connection is lost (logged and counted) or with ``wakeups=poll``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg

from asyncq.errors import Conflict
from asyncq.store.port.outbox import (
    AUDIT_IDS_MAX,
    OPERATOR_MOVES,
    Failure,
    Figures,
    Item,
    Lease,
    NewItem,
    OutboxAuditEntry,
    OutboxStoreTransaction,
    Step,
)
from asyncq.store.postgres.connection import Connection, Target
from asyncq.store.postgres.effects import execute_inside
from asyncq.store.postgres.failures import PostgresBusy
from asyncq.store.postgres.outbox_schema import OUTBOX
from asyncq.store.postgres.pooled import PooledStore, app_connection, one_row, raise_translated
from asyncq.store.postgres.wakeups import Wakeups

ITEM_COLUMNS = "seq, id, topic, body, created_at, state, attempts, budget_from, last_error, next_attempt_at, sent_at"
ORDER_LOCK = "SELECT pg_advisory_xact_lock($1)"
# The item, and (``$5`` a channel) the relays' NOTIFY in the same round trip, sent only if the item was added.
INSERT_ITEM = """WITH added AS (
  INSERT INTO {s}.outbox (seq, id, topic, body, created_at, state, next_attempt_at)
  SELECT coalesce(max(seq), 0) + 1, $1, $2, $3, $4::bigint, 'unsent', $4::bigint FROM {s}.outbox
  ON CONFLICT (id) DO NOTHING RETURNING seq
)
SELECT seq, CASE WHEN $5::text IS NOT NULL THEN pg_notify($5, '') END FROM added"""
SELECT_ITEM = f"SELECT {ITEM_COLUMNS} FROM {{s}}.outbox WHERE id = $1"
LOCK_ITEM = f"SELECT {ITEM_COLUMNS} FROM {{s}}.outbox WHERE id = $1 FOR UPDATE"
HEAD_BATCH = f"SELECT {ITEM_COLUMNS} FROM {{s}}.outbox WHERE state IN ('unsent', 'alarm') ORDER BY seq LIMIT $1"

# The fence: the lease renewed by owner and token, then the items changed only if it was.
RENEWED = """lease AS (
  UPDATE {s}.outbox_lease SET lease_until = $3::bigint + $4::bigint
  WHERE name = 'relay' AND owner = $1 AND token = $2 RETURNING lease_until
)"""
ADVANCE = f"""WITH {RENEWED}, marked AS (
  UPDATE {{s}}.outbox SET state = 'sent', sent_at = $3, last_error = NULL
  WHERE seq = $5 AND state = 'unsent' AND EXISTS (SELECT FROM lease) RETURNING seq
), started AS (
  UPDATE {{s}}.outbox SET attempts = attempts + 1
  WHERE seq = $6 AND state = 'unsent' AND next_attempt_at <= $3 AND EXISTS (SELECT FROM lease) RETURNING seq
)
SELECT (SELECT lease_until FROM lease), EXISTS (SELECT FROM marked), EXISTS (SELECT FROM started)"""
RECORD_FAILURE = f"""WITH {RENEWED}, failed AS (
  UPDATE {{s}}.outbox SET last_error = $6, next_attempt_at = $7,
    state = CASE WHEN $8::boolean OR attempts - budget_from >= $9 THEN 'alarm' ELSE 'unsent' END
  WHERE seq = $5 AND state = 'unsent' AND EXISTS (SELECT FROM lease) RETURNING state
)
SELECT (SELECT lease_until FROM lease), (SELECT state FROM failed)"""
RENEW_LEASE = f"WITH {RENEWED} SELECT lease_until FROM lease"
# Renew ``held`` ($2, $3) if it still holds, else take the lease for $1 if it is free or expired, with a new token.
HOLD_LEASE = """UPDATE {s}.outbox_lease SET
  token = CASE WHEN owner = $2 AND token = $3 THEN token ELSE token + 1 END,
  owner = CASE WHEN owner = $2 AND token = $3 THEN owner ELSE $1 END,
  lease_until = $4::bigint + $5::bigint
WHERE name = 'relay' AND ((owner = $2 AND token = $3) OR owner IS NULL OR lease_until <= $4)
RETURNING owner, token, lease_until"""
RELEASE_LEASE = """UPDATE {s}.outbox_lease SET owner = NULL, lease_until = NULL
WHERE name = 'relay' AND owner = $1 AND token = $2"""
READ_LEASE = "SELECT owner, token, lease_until FROM {s}.outbox_lease WHERE name = 'relay'"

# The first AUDIT_IDS_MAX ids in the given states behind a seq, and how many there are in all.
IDS_BEHIND = """SELECT
  ARRAY(SELECT id FROM {s}.outbox WHERE state = ANY($2::text[]) AND seq > $1 ORDER BY seq LIMIT $3),
  (SELECT count(*) FROM {s}.outbox WHERE state = ANY($2::text[]) AND seq > $1)"""
INSERT_AUDIT = """INSERT INTO {s}.outbox_audit (id, item_seq, at_ms, action, from_state, note, reason, attempts,
  last_error, skipped_ahead_of, skipped_count) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"""
SET_STATE = """UPDATE {s}.outbox SET state = $2, next_attempt_at = $3, budget_from = $4
WHERE seq = $1 AND state = $5"""
SELECT_AUDIT = """SELECT id, at_ms, action, from_state, note, reason, attempts, last_error, skipped_ahead_of,
  skipped_count FROM {s}.outbox_audit WHERE id = $1 OR $1::text IS NULL ORDER BY seq"""
# Every figure in one statement: one snapshot.
FIGURES = """SELECT
  (SELECT count(*) FROM {s}.outbox WHERE state = 'unsent'),
  (SELECT count(*) FROM {s}.outbox WHERE state = 'alarm'),
  (SELECT count(*) FROM {s}.outbox WHERE state = 'quarantined'),
  (SELECT min(created_at) FROM {s}.outbox WHERE state IN ('unsent', 'alarm')),
  head.id, head.state, head.attempts, head.last_error, lease.owner, lease.token, lease.lease_until
FROM {s}.outbox_lease lease LEFT JOIN LATERAL (
  SELECT id, state, attempts, last_error FROM {s}.outbox WHERE state IN ('unsent', 'alarm') ORDER BY seq LIMIT 1
) head ON true
WHERE lease.name = 'relay'"""


def order_key(schema: str) -> int:
    """The advisory lock every add to ``schema``'s outbox takes until its transaction ends."""
    digest = hashlib.blake2b(f"asyncq-outbox-order:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the outbox in ``schema``: its relays listen, an adding commit wakes them."""
    return f"{schema}_outbox"


async def add_in_transaction(conn: Connection, schema: str, item: NewItem, now_ms: int, *, notify: bool) -> bool:
    """Insert an unsent item inside the transaction ``conn`` has open, after the order lock (with ``notify``, the
    relays' NOTIFY if it was added; delivered at commit); ``False`` if the id exists with the same topic and body,
    else ``Conflict``."""
    await conn.execute(ORDER_LOCK, order_key(schema))
    wake = channel(schema) if notify else None
    if await conn.fetchrow(INSERT_ITEM.format(s=schema), item.id, item.topic, item.body, now_ms, wake) is not None:
        return True
    found = await conn.fetchrow(SELECT_ITEM.format(s=schema), item.id)
    assert found is not None  # never deleted
    if (found["topic"], found["body"]) != (item.topic, item.body):
        raise Conflict(f"outbox item {item.id!r} already exists with another topic or body")
    return False


async def _get(conn: Connection, schema: str, item_id: str) -> Item | None:
    row = await conn.fetchrow(SELECT_ITEM.format(s=schema), item_id)
    return None if row is None else Item(*row)


async def _head_batch(conn: Connection, schema: str, limit: int) -> list[Item]:
    return [Item(*row) for row in await conn.fetch(HEAD_BATCH.format(s=schema), limit)]


async def _hold_lease(
    conn: Connection, schema: str, held: Lease | None, owner: str, now_ms: int, lease_ms: int
) -> tuple[Lease, bool]:
    held_owner, held_token = (None, None) if held is None else (held.owner, held.token)
    row = await conn.fetchrow(HOLD_LEASE.format(s=schema), owner, held_owner, held_token, now_ms, lease_ms)
    if row is not None:
        return Lease(*row), True
    return Lease(*await one_row(conn, READ_LEASE.format(s=schema))), False


async def _renew_lease(conn: Connection, schema: str, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
    until = await conn.fetchval(RENEW_LEASE.format(s=schema), lease.owner, lease.token, now_ms, lease_ms)
    return None if until is None else Lease(lease.owner, lease.token, until)


async def _release_lease(conn: Connection, schema: str, lease: Lease) -> bool:
    return bool(await conn.execute(RELEASE_LEASE.format(s=schema), lease.owner, lease.token) == "UPDATE 1")


async def _advance(
    conn: Connection, schema: str, lease: Lease, now_ms: int, lease_ms: int, sent: int | None, start: int | None
) -> Step:
    until, marked, started = await one_row(
        conn, ADVANCE.format(s=schema), lease.owner, lease.token, now_ms, lease_ms, sent, start
    )
    if until is None:
        return Step(None, marked=False, started=False)
    return Step(Lease(lease.owner, lease.token, until), marked, started)


async def _record_failure(
    conn: Connection, schema: str, lease: Lease, now_ms: int, lease_ms: int, seq: int, failure: Failure
) -> tuple[Lease | None, str | None]:
    fields = (failure.error, failure.next_attempt_at, failure.permanent, failure.alarm_after)
    until, state = await one_row(
        conn, RECORD_FAILURE.format(s=schema), lease.owner, lease.token, now_ms, lease_ms, seq, *fields
    )
    return (None, None) if until is None else (Lease(lease.owner, lease.token, until), state)


async def _operate(
    conn: Connection, schema: str, item_id: str, action: str, now_ms: int, note: str, reason: str | None
) -> OutboxAuditEntry:
    """The operator's move along ``OPERATOR_MOVES`` with its audit row (``SqliteOutboxStore``'s rules); the item's
    row is locked first, so a relay's step on it waits, then finds it moved."""
    sources, target = OPERATOR_MOVES[action]
    row = await conn.fetchrow(LOCK_ITEM.format(s=schema), item_id)
    item = None if row is None else Item(*row)
    if item is None or item.state not in sources:
        raise ValueError(f"outbox item {item_id!r} is {'missing' if item is None else item.state}: cannot {action}")
    skipped: list[str] = []
    count = 0
    if action != "retry":
        states = ["unsent", "alarm"] if action == "quarantine" else ["sent"]
        ids, count = await one_row(conn, IDS_BEHIND.format(s=schema), item.seq, states, AUDIT_IDS_MAX)
        skipped = list(ids)
    entry = OutboxAuditEntry(
        item_id, now_ms, action, item.state, note, reason, item.attempts, item.last_error, skipped, count
    )
    await conn.execute(
        INSERT_AUDIT.format(s=schema),
        *(item_id, item.seq, now_ms, action, item.state, note, reason, item.attempts, item.last_error),
        *(json.dumps(skipped), count),
    )
    await conn.execute(SET_STATE.format(s=schema), item.seq, target, now_ms, item.attempts, item.state)
    return entry


async def _audit(conn: Connection, schema: str, item_id: str | None) -> list[OutboxAuditEntry]:
    rows = await conn.fetch(SELECT_AUDIT.format(s=schema), item_id)
    return [OutboxAuditEntry.from_row(row) for row in rows]


async def _figures(conn: Connection, schema: str, now_ms: int) -> Figures:
    unsent, alarmed, quarantined, oldest, *head, owner, token, until = await one_row(conn, FIGURES.format(s=schema))
    head_id, head_state, head_attempts, head_error = head
    return Figures(
        now_ms=now_ms,
        unsent=unsent + alarmed,
        alarm=head_state == "alarm",
        alarmed=alarmed,
        quarantined=quarantined,
        oldest_unsent_age_ms=None if oldest is None else max(0, now_ms - oldest),
        head_id=head_id,
        head_state=head_state,
        head_attempts=head_attempts or 0,
        head_last_error=head_error,
        lease_owner=owner,
        lease_token=token,
        lease_until=until,
    )


class PostgresOutboxTransaction:
    """An open transaction on a pooled connection: the app's SQL (``$1`` parameters) and its items commit
    together. Usable only inside its block."""

    def __init__(self, schema: str, conn: Connection) -> None:
        self._schema = schema
        self._conn = conn
        self._open = True
        #: How many items this transaction added (the facade wakes this process's relays after the commit).
        self.added = 0

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows as tuples."""
        self._check_open()
        return await execute_inside(self._conn, statement, parameters)

    async def add(self, item: NewItem, now_ms: int) -> bool:
        self._check_open()
        # The transaction's first item sends its one NOTIFY.
        added = await add_in_transaction(self._conn, self._schema, item, now_ms, notify=not self.added)
        self.added += added
        return added

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("this transaction's block has ended: open a new one with transaction()")


class PostgresOutboxStore(PooledStore):
    """The outbox store's port on PostgreSQL. Open with ``await PostgresOutboxStore.open(url)``."""

    #: Transient server and connection failures: the relay logs them and tries again later.
    busy_errors: tuple[type[Exception], ...] = (PostgresBusy,)

    def __init__(self, target: Target, pool: asyncpg.Pool) -> None:
        super().__init__(target, pool)
        self._holders: set[asyncio.Task[Any]] = set()  # tasks inside a transaction() block
        #: The relays' wake-ups from other connections: listening from the first wait on (a process that only adds
        #: items holds no listening connection), polling with ``wakeups=poll`` or while the listener is lost.
        self.wakeups = Wakeups(target, target.wakeups, channel=channel(target.schema), what="outbox items")

    @classmethod
    async def open(cls, url: object) -> PostgresOutboxStore:
        """Open the outbox of the schema the URL names (created and migrated under the advisory lock if needed)."""
        return cls(*await cls.open_target(url, OUTBOX))

    async def add(self, item: NewItem, now_ms: int, *, connection: object = None) -> bool:
        """Add in a transaction of the store's, or (``connection``: the app's asyncpg connection with its
        transaction open) inside the app's, where the item commits or rolls back with the app's rows."""
        if connection is None:
            self._refuse_inside_a_block()
            added: bool = await self._write(functools.partial(add_in_transaction, notify=True), item, now_ms)
            return added
        conn = app_connection(connection)
        try:  # each add notifies: PostgreSQL delivers one of a transaction's identical notifications, at commit
            return await add_in_transaction(conn, self.schema, item, now_ms, notify=True)
        except Exception as error:
            raise_translated(error, self.location)

    def _refuse_inside_a_block(self) -> None:
        """An add on another connection would wait for the order lock this task's open block may hold: forever."""
        if asyncio.current_task() in self._holders:
            raise RuntimeError(
                "this task holds an open transaction on the store: use the transaction's own methods inside its "
                "block (the call would wait for the block to end, forever)"
            )

    def transaction(self) -> AbstractAsyncContextManager[OutboxStoreTransaction]:
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[PostgresOutboxTransaction]:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with self._pool.acquire() as conn:
                tx = PostgresOutboxTransaction(self.schema, conn)
                self._holders.add(task)
                try:
                    async with conn.transaction():
                        yield tx
                finally:
                    tx._open = False
                    self._holders.discard(task)
        except Exception as error:
            raise_translated(error, self.location)

    async def wait_for_items(self, timeout: float) -> None:
        await self.wakeups.wait(timeout)

    async def close(self) -> None:
        await self.wakeups.close()
        await super().close()

    async def get(self, item_id: str) -> Item | None:
        found: Item | None = await self._run(_get, item_id)
        return found

    async def operate(self, item_id: str, action: str, now_ms: int, note: str, reason: str | None) -> OutboxAuditEntry:
        entry: OutboxAuditEntry = await self._write(_operate, item_id, action, now_ms, note, reason)
        return entry

    async def audit(self, item_id: str | None) -> list[OutboxAuditEntry]:
        entries: list[OutboxAuditEntry] = await self._run(_audit, item_id)
        return entries

    async def figures(self, now_ms: int) -> Figures:
        figures: Figures = await self._run(_figures, now_ms)
        return figures

    async def hold_lease(self, held: Lease | None, owner: str, now_ms: int, lease_ms: int) -> tuple[Lease, bool]:
        found: tuple[Lease, bool] = await self._run(_hold_lease, held, owner, now_ms, lease_ms)
        return found

    async def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        renewed: Lease | None = await self._run(_renew_lease, lease, now_ms, lease_ms)
        return renewed

    async def release_lease(self, lease: Lease) -> bool:
        released: bool = await self._run(_release_lease, lease)
        return released

    async def head_batch(self, limit: int) -> list[Item]:
        items: list[Item] = await self._run(_head_batch, limit)
        return items

    async def advance(self, lease: Lease, now_ms: int, lease_ms: int, sent: int | None, start: int | None) -> Step:
        step: Step = await self._run(_advance, lease, now_ms, lease_ms, sent, start)
        return step

    async def record_failure(
        self, lease: Lease, now_ms: int, lease_ms: int, seq: int, failure: Failure
    ) -> tuple[Lease | None, str | None]:
        recorded: tuple[Lease | None, str | None] = await self._run(
            _record_failure, lease, now_ms, lease_ms, seq, failure
        )
        return recorded
