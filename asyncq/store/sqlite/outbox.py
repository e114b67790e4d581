"""``SqliteOutboxStore``: the outbox store's port on one SQLite file, beside the app's own tables (the port,
``asyncq.store.port.outbox``, draws the edges an item moves along). Its named statements, and each transition
as one short transaction (the tables are ``OUTBOX_TABLES`` in ``asyncq.store.sqlite.schema``).

Relay writes (start an attempt, mark sent, record a failure) run in the same transaction as a renewal of the
relay's lease by owner and token, so a relay that lost its lease changes nothing. Operator writes are not
fenced: they are the operator's decision and are recorded in ``asyncq_outbox_audit``. Every function takes
``now`` from its caller and assumes its arguments are already validated. The relay's lease is one row, so
one relay runs per outbox file.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from contextlib import AbstractAsyncContextManager
from typing import Any

from asyncq.core.clock import wall_clock_ms
from asyncq.core.values import check_time
from asyncq.errors import Conflict
from asyncq.store.port.outbox import (
    ALARM,
    AUDIT_IDS_MAX,
    DEFAULT_TOPIC,
    OPERATOR_MOVES,
    QUARANTINED,
    UNSENT,
    Failure,
    Figures,
    Item,
    Lease,
    NewItem,
    OutboxAuditEntry,
    OutboxStoreTransaction,
    Step,
)
from asyncq.store.sqlite.aio import AppTransaction, AsyncFile
from asyncq.store.sqlite.connection import check_path, configure, write_transaction
from asyncq.store.sqlite.durability import LEVELS
from asyncq.store.sqlite.schema import OUTBOX_TABLES

LEASE_NAME = "relay"
ITEM_COLUMNS = "seq, id, topic, body, created_at, state, attempts, budget_from, last_error, next_attempt_at, sent_at"
HAS_TABLES = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'asyncq_outbox_lease'"
INSERT_ITEM = """INSERT INTO asyncq_outbox (id, topic, body, created_at, state, next_attempt_at)
VALUES (:id, :topic, :body, :now, 'unsent', :now)"""
SELECT_ITEM = f"SELECT {ITEM_COLUMNS} FROM asyncq_outbox WHERE id = :id"
# The head: the lowest seq among waiting items, each state read through its own index range.
HEAD_BATCH = f"""SELECT {ITEM_COLUMNS} FROM asyncq_outbox WHERE seq IN (
  SELECT seq FROM (SELECT seq FROM asyncq_outbox WHERE state = 'unsent' ORDER BY seq LIMIT :limit)
  UNION ALL SELECT seq FROM (SELECT seq FROM asyncq_outbox WHERE state = 'alarm' ORDER BY seq LIMIT :limit)
) ORDER BY seq LIMIT :limit"""
START_ATTEMPT = """UPDATE asyncq_outbox SET attempts = attempts + 1
WHERE seq = :seq AND state = 'unsent' AND next_attempt_at <= :now"""
MARK_SENT = """UPDATE asyncq_outbox SET state = 'sent', sent_at = :now, last_error = NULL
WHERE seq = :seq AND state = 'unsent'"""
RECORD_FAILURE = """UPDATE asyncq_outbox SET last_error = :error, next_attempt_at = :next_attempt_at,
  state = CASE WHEN :permanent OR attempts - budget_from >= :alarm_after THEN 'alarm' ELSE 'unsent' END
WHERE seq = :seq AND state = 'unsent' RETURNING state"""
SET_STATE = """UPDATE asyncq_outbox SET state = :state, next_attempt_at = :now, budget_from = :budget_from
WHERE seq = :seq AND state = :from_state"""
WAITING_BEHIND = "SELECT id FROM asyncq_outbox WHERE state IN ('unsent', 'alarm') AND seq > :seq ORDER BY seq"
SENT_BEHIND = "SELECT id FROM asyncq_outbox WHERE state = 'sent' AND seq > :seq ORDER BY seq"
INSERT_AUDIT = """INSERT INTO asyncq_outbox_audit (id, item_seq, at_ms, action, from_state, note, reason, attempts,
  last_error, skipped_ahead_of, skipped_count)
VALUES (:id, :seq, :now, :action, :from_state, :note, :reason, :attempts, :last_error, :skipped, :skipped_count)"""
SELECT_AUDIT = """SELECT id, at_ms, action, from_state, note, reason, attempts, last_error, skipped_ahead_of,
  skipped_count FROM asyncq_outbox_audit WHERE id = :id OR :id IS NULL ORDER BY seq"""
COUNT_BY_STATE = "SELECT count(*) FROM asyncq_outbox WHERE state = :state"
HAS_WAITING = "SELECT 1 FROM asyncq_outbox WHERE state = 'unsent' LIMIT 1"
OLDEST_WAITING = "SELECT min(created_at) FROM asyncq_outbox WHERE state IN ('unsent', 'alarm')"

# Taken only when free or expired, always with a new token (the fence).
LEASE_ACQUIRE = """UPDATE asyncq_outbox_lease SET owner = :owner, token = token + 1, lease_until = :now + :lease_ms
WHERE name = :name AND (owner IS NULL OR lease_until <= :now) RETURNING token, lease_until"""
# Renewed only by the holder of this token: any acquisition since has changed it.
LEASE_RENEW = """UPDATE asyncq_outbox_lease SET lease_until = :now + :lease_ms
WHERE name = :name AND owner = :owner AND token = :token RETURNING lease_until"""
LEASE_RELEASE = """UPDATE asyncq_outbox_lease SET owner = NULL, lease_until = NULL
WHERE name = :name AND owner = :owner AND token = :token"""
LEASE_READ = "SELECT owner, token, lease_until FROM asyncq_outbox_lease WHERE name = :name"


def ensure_tables(con: sqlite3.Connection) -> None:
    """Create the outbox tables inside the caller's transaction, if they are missing."""
    if con.execute(HAS_TABLES).fetchone()[0] == 0:
        for statement in OUTBOX_TABLES:
            con.execute(statement)


def open_tables(con: sqlite3.Connection, journal_mode: str, synchronous: str) -> None:
    """Configure a freshly opened connection and create the outbox tables if missing."""
    configure(con, journal_mode, synchronous)
    with write_transaction(con):
        ensure_tables(con)


def add_in_transaction(con: sqlite3.Connection, item: NewItem, now_ms: int) -> bool:
    """Insert an unsent item inside the caller's transaction (creating the tables if needed); ``False`` if the
    id exists with the same topic and body, else ``Conflict``."""
    ensure_tables(con)
    found = get_item(con, item.id)
    if found is not None:
        if (found.topic, found.body) != (item.topic, item.body):
            raise Conflict(f"outbox item {item.id!r} already exists with another topic or body")
        return False
    con.execute(INSERT_ITEM, {"id": item.id, "topic": item.topic, "body": item.body, "now": now_ms})
    return True


def add(con: sqlite3.Connection, item: NewItem, now_ms: int) -> bool:
    """:func:`add_in_transaction` in a write transaction of its own."""
    with write_transaction(con):
        return add_in_transaction(con, item, now_ms)


def add_sync(
    con: sqlite3.Connection, item_id: str, body: Any, *, topic: str = DEFAULT_TOPIC, now_ms: int | None = None
) -> bool:
    """Add an outbox item through the caller's ``sqlite3`` connection, joining its open transaction (or in
    one of its own): ``True`` if added, ``False`` if the same id, topic and body exist, ``Conflict`` for
    another topic or body. Creates the outbox tables in that transaction if needed."""
    item = NewItem.check(item_id, body, topic)
    now = wall_clock_ms() if now_ms is None else check_time(now_ms)
    if con.in_transaction:
        return add_in_transaction(con, item, now)
    return add(con, item, now)


def get_item(con: sqlite3.Connection, item_id: str) -> Item | None:
    """One item by id, or ``None``."""
    row = con.execute(SELECT_ITEM, {"id": item_id}).fetchone()
    return None if row is None else Item(*row)


def head_batch(con: sqlite3.Connection, limit: int) -> list[Item]:
    """Up to ``limit`` waiting items (``unsent`` or ``alarm``) in ``seq`` order; a read, finished here."""
    return [Item(*row) for row in con.execute(HEAD_BATCH, {"limit": limit}).fetchall()]


def _renew(con: sqlite3.Connection, owner: str, token: int, now_ms: int, lease_ms: int) -> Lease | None:
    params = {"name": LEASE_NAME, "owner": owner, "token": token, "now": now_ms, "lease_ms": lease_ms}
    row = con.execute(LEASE_RENEW, params).fetchone()
    return None if row is None else Lease(owner, token, row[0])


def hold_lease(
    con: sqlite3.Connection, held: Lease | None, owner: str, now_ms: int, lease_ms: int
) -> tuple[Lease, bool]:
    """Renew ``held`` if it is still ours, else take the lease if it is free or expired (token + 1).

    Returns the lease as stored afterwards and whether it is ours (renewed or just acquired)."""
    with write_transaction(con):
        if held is not None and held.owner is not None:
            renewed = _renew(con, held.owner, held.token, now_ms, lease_ms)
            if renewed is not None:
                return renewed, True
        params = {"name": LEASE_NAME, "owner": owner, "now": now_ms, "lease_ms": lease_ms}
        row = con.execute(LEASE_ACQUIRE, params).fetchone()
        if row is not None:
            return Lease(owner, row[0], row[1]), True
        return Lease(*con.execute(LEASE_READ, {"name": LEASE_NAME}).fetchone()), False


def renew_lease(con: sqlite3.Connection, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
    """Extend ``lease`` if it still holds (same owner and token); ``None`` if it was lost. Never acquires."""
    assert lease.owner is not None
    with write_transaction(con):
        return _renew(con, lease.owner, lease.token, now_ms, lease_ms)


def release_lease(con: sqlite3.Connection, lease: Lease) -> bool:
    """Free the lease if ``lease`` still holds it (the token stays, so the next holder gets a new one)."""
    with write_transaction(con):
        params = {"name": LEASE_NAME, "owner": lease.owner, "token": lease.token}
        return con.execute(LEASE_RELEASE, params).rowcount == 1


def advance(
    con: sqlite3.Connection, lease: Lease, now_ms: int, lease_ms: int, sent: int | None, start: int | None
) -> Step:
    """Fenced, in one transaction: mark item ``sent`` (a seq, after its verified ACK) sent and count an
    attempt on item ``start`` before it is delivered. If the lease was lost, nothing changes."""
    assert lease.owner is not None
    with write_transaction(con):
        renewed = _renew(con, lease.owner, lease.token, now_ms, lease_ms)
        if renewed is None:
            return Step(None, marked=False, started=False)
        marked = sent is not None and con.execute(MARK_SENT, {"seq": sent, "now": now_ms}).rowcount == 1
        started = start is not None and con.execute(START_ATTEMPT, {"seq": start, "now": now_ms}).rowcount == 1
    return Step(renewed, marked, started)


def record_failure(
    con: sqlite3.Connection, lease: Lease, now_ms: int, lease_ms: int, seq: int, failure: Failure
) -> tuple[Lease | None, str | None]:
    """Fenced: store the error and the next attempt time; ``alarm`` once the budget is spent or at once if
    ``permanent``. Returns the renewed lease (``None`` if lost) and the item's new state."""
    assert lease.owner is not None
    with write_transaction(con):
        renewed = _renew(con, lease.owner, lease.token, now_ms, lease_ms)
        if renewed is None:
            return None, None
        params = {"seq": seq, "error": failure.error, "next_attempt_at": failure.next_attempt_at}
        params |= {"permanent": failure.permanent, "alarm_after": failure.alarm_after}
        row = con.execute(RECORD_FAILURE, params).fetchone()
    return renewed, None if row is None else str(row[0])


def _ids(con: sqlite3.Connection, statement: str, seq: int) -> tuple[list[str], int]:
    """The first ``AUDIT_IDS_MAX`` ids the statement finds behind ``seq`` and how many it finds in all (streamed,
    so a long backlog is counted without being held in memory)."""
    ids: list[str] = []
    count = 0
    for (item_id,) in con.execute(statement, {"seq": seq}):
        count += 1
        if count <= AUDIT_IDS_MAX:
            ids.append(str(item_id))
    return ids, count


def operator_move(
    con: sqlite3.Connection, item_id: str, action: str, now_ms: int, note: str, reason: str | None
) -> OutboxAuditEntry:
    """``retry`` (alarm or unsent → unsent, due now, a fresh budget), ``quarantine`` (unsent or alarm →
    quarantined, recording the waiting items that now go first) or ``requeue`` (quarantined → unsent at its
    own seq, a fresh budget, recording the items sent while it was out). ``ValueError`` if the item is
    missing or in another state (nothing changes). The audit row and the move commit together."""
    sources, target = OPERATOR_MOVES[action]
    with write_transaction(con):
        item = get_item(con, item_id)
        if item is None or item.state not in sources:
            raise ValueError(f"outbox item {item_id!r} is {'missing' if item is None else item.state}: cannot {action}")
        skipped: list[str] = []
        count = 0
        if action != "retry":
            skipped, count = _ids(con, WAITING_BEHIND if action == "quarantine" else SENT_BEHIND, item.seq)
        entry = OutboxAuditEntry(
            item_id, now_ms, action, item.state, note, reason, item.attempts, item.last_error, skipped, count
        )
        con.execute(INSERT_AUDIT, _audit_params(item.seq, entry))
        move = {"seq": item.seq, "state": target, "from_state": item.state, "now": now_ms}
        con.execute(SET_STATE, move | {"budget_from": item.attempts})
    return entry


def _audit_params(seq: int, entry: OutboxAuditEntry) -> dict[str, Any]:
    params = {"seq": seq, "now": entry.at_ms, "skipped": json.dumps(entry.skipped_ahead_of)}
    fields = ("id", "action", "from_state", "note", "reason", "attempts", "last_error", "skipped_count")
    return params | {name: getattr(entry, name) for name in fields}


def read_audit(con: sqlite3.Connection, item_id: str | None) -> list[OutboxAuditEntry]:
    """The audit rows of one item (or of all items), oldest first."""
    rows = con.execute(SELECT_AUDIT, {"id": item_id}).fetchall()
    return [OutboxAuditEntry.from_row(row) for row in rows]


def read_figures(con: sqlite3.Connection, now_ms: int) -> Figures:
    """Counts by state, the oldest waiting item's age, the head item and the lease, read in one transaction
    so that they agree."""
    con.execute("BEGIN")
    try:
        unsent, alarm, quarantined = (
            int(con.execute(COUNT_BY_STATE, {"state": state}).fetchone()[0]) for state in (UNSENT, ALARM, QUARANTINED)
        )
        oldest = con.execute(OLDEST_WAITING).fetchone()[0]
        heads = head_batch(con, 1)
        lease = Lease(*con.execute(LEASE_READ, {"name": LEASE_NAME}).fetchone())
    finally:
        con.execute("COMMIT")
    head = heads[0] if heads else None
    return Figures(
        now_ms=now_ms,
        unsent=unsent + alarm,
        alarm=head is not None and head.state == ALARM,
        alarmed=alarm,
        quarantined=quarantined,
        oldest_unsent_age_ms=None if oldest is None else max(0, now_ms - oldest),
        head_id=None if head is None else head.id,
        head_state=None if head is None else head.state,
        head_attempts=0 if head is None else head.attempts,
        head_last_error=None if head is None else head.last_error,
        lease_owner=lease.owner,
        lease_token=lease.token,
        lease_until=lease.lease_until,
    )


class SqliteOutboxTransaction(AppTransaction):
    """An open ``BEGIN IMMEDIATE`` on the outbox's connection: the app's SQL and its items commit together."""

    async def add(self, item: NewItem, now_ms: int) -> bool:
        added: bool = await self._run_step(add_in_transaction, item, now_ms)
        self.added += added
        return added


def _has_waiting_items(con: sqlite3.Connection) -> bool:
    return con.execute(HAS_WAITING).fetchone() is not None


class SqliteOutboxStore:
    """The outbox store's port on one SQLite file. Open with ``await SqliteOutboxStore.open(path)``."""

    #: A busy or locked file surfaces as ``OperationalError``: the relay tries again later.
    busy_errors: tuple[type[Exception], ...] = (sqlite3.OperationalError,)

    def __init__(self, file: AsyncFile) -> None:
        self._file = file
        self.location = file.path

    @classmethod
    async def open(cls, path: object, *, durability: str = "full", busy_timeout: float = 5.0) -> SqliteOutboxStore:
        """Open (creating the outbox tables if missing) ``path`` at a durability level of ``LEVELS``."""
        level = LEVELS.get(durability)
        if level is None:
            raise ValueError(f"durability must be one of {sorted(LEVELS)}")
        file = check_path(path)
        setup = functools.partial(open_tables, journal_mode=level.journal_mode, synchronous=level.synchronous)
        store = cls(AsyncFile(await AsyncFile.connect(file, busy_timeout, setup), file))
        store._file.may_have_work = _has_waiting_items  # other tables' commits wake no relay
        return store

    async def add(self, item: NewItem, now_ms: int, *, connection: object = None) -> bool:
        if connection is not None:
            raise TypeError(
                "a SQLite outbox joins the app's transaction through outbox.transaction(), or asyncq.sqlite.add_sync"
                " on the app's own sqlite3 connection"
            )
        added: bool = await self._file.run(add, item, now_ms)
        return added

    def transaction(self) -> AbstractAsyncContextManager[OutboxStoreTransaction]:
        return self._file.open_transaction(SqliteOutboxTransaction(self._file))

    async def get(self, item_id: str) -> Item | None:
        found: Item | None = await self._file.run(get_item, item_id)
        return found

    async def operate(self, item_id: str, action: str, now_ms: int, note: str, reason: str | None) -> OutboxAuditEntry:
        entry: OutboxAuditEntry = await self._file.run(operator_move, item_id, action, now_ms, note, reason)
        return entry

    async def audit(self, item_id: str | None) -> list[OutboxAuditEntry]:
        entries: list[OutboxAuditEntry] = await self._file.run(read_audit, item_id)
        return entries

    async def figures(self, now_ms: int) -> Figures:
        figures: Figures = await self._file.run(read_figures, now_ms)
        return figures

    async def hold_lease(self, held: Lease | None, owner: str, now_ms: int, lease_ms: int) -> tuple[Lease, bool]:
        found: tuple[Lease, bool] = await self._file.run(hold_lease, held, owner, now_ms, lease_ms)
        return found

    async def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        renewed: Lease | None = await self._file.run(renew_lease, lease, now_ms, lease_ms)
        return renewed

    async def release_lease(self, lease: Lease) -> bool:
        released: bool = await self._file.run(release_lease, lease)
        return released

    async def head_batch(self, limit: int) -> list[Item]:
        items: list[Item] = await self._file.run(head_batch, limit)
        return items

    async def advance(self, lease: Lease, now_ms: int, lease_ms: int, sent: int | None, start: int | None) -> Step:
        step: Step = await self._file.run(advance, lease, now_ms, lease_ms, sent, start)
        return step

    async def record_failure(
        self, lease: Lease, now_ms: int, lease_ms: int, seq: int, failure: Failure
    ) -> tuple[Lease | None, str | None]:
        recorded: tuple[Lease | None, str | None] = await self._file.run(
            record_failure, lease, now_ms, lease_ms, seq, failure
        )
        return recorded

    async def wait_for_items(self, timeout: float) -> None:
        await self._file.wait_for_rows(timeout)  # another connection's commit to the file, seen by its watcher

    async def close(self) -> None:
        await self._file.close()
