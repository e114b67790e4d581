"""``PostgresQueueStore``: the queue store's port on PostgreSQL (asyncpg), over ``transitions``' steps.

Every call is one transaction on a connection of the store's pool (``READ COMMITTED``: each statement sees what
committed before it, and the compare-and-sets decide on the row version they lock). Reads that must agree run
in one ``REPEATABLE READ`` snapshot. The app's own transaction can carry jobs too: ``transaction()`` opens one
on the pool for the app's statements, and ``enqueue(rows, connection=conn)`` inserts on the app's own asyncpg
connection inside the transaction the app holds there, so the jobs commit or roll back with its rows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from asyncq.core.claim_plan import plan_claim
from asyncq.core.dependencies import Ripple
from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.flow_limits import Limits, LimitUsage
from asyncq.core.jobs import AuditEntry, CancelOutcome, Enqueued, Finish, Job, NewJob, Settled, Ticket
from asyncq.core.lifecycle import PENDING, Fence, Renewal, status_after_cancel
from asyncq.core.offers import Offer, offered_tickets
from asyncq.core.retention import RetentionRule, Windows
from asyncq.core.stats import Stats
from asyncq.errors import StoreError
from asyncq.store.port.console import ConsoleStore
from asyncq.store.port.queue import Capabilities, JobFilter, StoreTransaction
from asyncq.store.port.reports import BackupReport, PruneReport, StoreDescription
from asyncq.store.postgres import admin, claiming, flow, limits, offers, retention, transitions
from asyncq.store.postgres.connection import (
    Connection,
    Target,
    migrate,
    open_pool,
    parse_url,
    read_version,
    settings,
)
from asyncq.store.postgres.failures import as_busy
from asyncq.store.postgres.graph_store import PostgresGraphCalls
from asyncq.store.postgres.inspection import check_reader
from asyncq.store.postgres.pooled import dropped_if_lost
from asyncq.store.postgres.schedules_store import PostgresSchedules
from asyncq.store.postgres.schema import QUEUE
from asyncq.store.postgres.statements import NOTIFY
from asyncq.store.postgres.transaction import PostgresTransaction
from asyncq.store.postgres.wakeups import Wakeups

T = TypeVar("T")


class PostgresQueueStore(PostgresSchedules, PostgresGraphCalls):
    """The queue store's port on PostgreSQL (see ``asyncq.store.port.queue`` for each method's rule)."""

    def __init__(self, target: Target, pool: asyncpg.Pool, wakeups: Wakeups, read_only: bool) -> None:
        self.target = target
        self.schema = target.schema
        self.location = target.location
        self._pool = pool
        self.wakeups = wakeups
        self.capabilities = Capabilities(backup=False, app_sql=True, survives_power_loss=True, read_only=read_only)
        self._limited: set[str] = set()  # the queues a claim found limited (a hint: each claim reads them again)

    @classmethod
    async def open(cls, url: object, *, read_only: bool = False) -> PostgresQueueStore:
        """Open the queue the URL names: its schema created and migrated (under the advisory lock) unless
        ``read_only``, which opens an existing, current queue whose every write is refused."""
        target = parse_url(url)
        pool = await open_pool(target, read_only=read_only)
        try:
            async with pool.acquire() as conn:
                if read_only:
                    await check_reader(conn, target)
                else:
                    await migrate(conn, target.schema, QUEUE)
                    await admin.fold_counts(conn, target.schema)
            wakeups = Wakeups(target, "poll" if read_only else target.wakeups)
            await wakeups.start()
        except BaseException as error:
            await pool.close()
            raise _translated(error, target.location) from None
        return cls(target, pool, wakeups, read_only)

    # -- producers ----------------------------------------------------------------------------------------

    async def enqueue(self, rows: Sequence[NewJob], *, connection: object = None) -> list[Enqueued]:
        """Insert ``rows`` all or none, in one transaction of the store's, or (``connection``: the app's asyncpg
        connection with its transaction open) inside the app's: then they commit or roll back with its rows."""
        if connection is not None:
            return await self._enqueue_on(connection, rows)
        added: list[Enqueued] = await self._write(self._enqueue_step, rows)
        if True in added:
            self.wakeups.notify()
        return added

    async def _enqueue_step(self, conn: Connection, schema: str, rows: Sequence[NewJob]) -> list[Enqueued]:
        added = await transitions.enqueue_rows(conn, schema, rows)
        if True in added:
            await conn.execute(NOTIFY, self.wakeups.channel)
        return added

    async def _enqueue_on(self, connection: object, rows: Sequence[NewJob]) -> list[Enqueued]:
        self._check_writable()
        if not isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            raise TypeError(f"connection must be an asyncpg connection, not {type(connection).__name__}")
        if not connection.is_in_transaction():
            raise ValueError("connection has no transaction open: enqueue inside `async with conn.transaction()`")
        tx = PostgresTransaction(self, connection)
        try:
            return await tx.enqueue_rows(rows)
        except Exception as error:
            raise _translated(error, self.location) from None

    def transaction(self) -> AbstractAsyncContextManager[StoreTransaction]:
        self._check_writable()
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[PostgresTransaction]:
        async with self._pool.acquire() as conn:
            tx = PostgresTransaction(self, conn)
            try:
                async with conn.transaction():
                    yield tx
            finally:
                tx._open = False
        if tx.added:
            self.wakeups.notify()

    # -- workers ------------------------------------------------------------------------------------------

    async def settle_and_claim(
        self,
        finishes: Sequence[Finish],
        now_ms: int,
        owner: str,
        lease_ms: int,
        wants: Sequence[tuple[str, int]],
        total: int | None,
        *,
        start_now: int | None = None,
        started: Sequence[Ticket] = (),
        resend: bool = False,
        offer: Offer | None = None,
    ) -> Settled:
        begun = [(ticket.seq, ticket.id, ticket.fence) for ticket in started]

        ripple = Ripple()

        async def cycle(conn: Connection, schema: str) -> Settled:
            activated = await transitions.activate(conn, schema, begun)
            statuses = (
                await transitions.finish(conn, schema, finishes, now_ms, resend=resend, ripple=ripple)
                if finishes
                else []
            )
            await self._notify_if_pending(conn, statuses)
            plan = plan_claim([n for _queue, n in wants], total, start_now)
            if plan.sweep:
                await claiming.sweep(conn, schema, now_ms, ripple)
            tickets, holds = await claiming.claim(conn, schema, owner, now_ms, lease_ms, wants, plan, self._limited)
            if offer is not None:
                queues = [queue for queue, _n in wants]
                tickets += await offers.settle_offer(conn, schema, offer, owner, queues, lease_ms, now_ms, len(tickets))
            return Settled(statuses, tickets, activated, holds)

        settled: Settled = await self._write(cycle)
        if PENDING in settled.statuses or ripple.released:
            self.wakeups.notify()
        return settled

    async def offered(self, owner: str, now_ms: int) -> list[Ticket]:
        rows = await self._read(offers.offered_rows, owner, now_ms)
        return offered_tickets(rows, owner)

    async def finish(self, finishes: Sequence[Finish], now_ms: int) -> list[str | None]:
        ripple = Ripple()

        async def step(conn: Connection, schema: str) -> list[str | None]:
            statuses = await transitions.finish(conn, schema, finishes, now_ms, ripple=ripple)
            await self._notify_if_pending(conn, statuses)
            return statuses

        statuses: list[str | None] = await self._write(step) if finishes else []
        if PENDING in statuses or ripple.released:
            self.wakeups.notify()
        return statuses

    async def _notify_if_pending(self, conn: Connection, statuses: Sequence[str | None]) -> None:
        """A retry makes a job pending again (ready at once if its delay is 0): tell every host."""
        if PENDING in statuses:
            await conn.execute(NOTIFY, self.wakeups.channel)

    async def extend(self, leases: Sequence[tuple[str, Fence]], now_ms: int, lease_ms: int) -> list[Renewal | None]:
        renewed: list[Renewal | None] = await self._write(transitions.extend, leases, now_ms, lease_ms)
        return renewed

    async def release(
        self, leases: Sequence[tuple[str, Fence]], now_ms: int, counted: Sequence[bool] | None = None
    ) -> list[bool]:
        refunds = [True] * len(leases) if counted is None else list(counted)

        async def step(conn: Connection, schema: str) -> list[bool]:
            released = await transitions.release(conn, schema, leases, now_ms, refunds)
            if any(released):
                await conn.execute(NOTIFY, self.wakeups.channel)
            return released

        released: list[bool] = await self._write(step)
        if any(released):
            self.wakeups.notify()
        return released

    async def wait_for_work(self, timeout: float) -> None:
        await self.wakeups.wait(timeout)

    def host_rides(self, start: Callable[[], bool]) -> Callable[[], None]:
        return lambda: None  # each enqueue commits on a pooled connection of its own

    # -- operators ----------------------------------------------------------------------------------------

    async def redrive(self, job_id: str, now_ms: int, deadline_ms: int, note: str) -> AuditEntry:
        async def step(conn: Connection, schema: str) -> AuditEntry:
            entry = await transitions.redrive(conn, schema, job_id, now_ms, deadline_ms, note)
            await conn.execute(NOTIFY, self.wakeups.channel)
            return AuditEntry(*entry)

        entry: AuditEntry = await self._write(step)
        self.wakeups.notify()
        return entry

    async def cancel(self, job_id: str, now_ms: int, note: str) -> CancelOutcome:
        ripple = Ripple()

        async def step(conn: Connection, schema: str) -> CancelOutcome:
            decided, entry, status = await transitions.cancel(conn, schema, job_id, now_ms, note, ripple)
            audit = None if entry is None else AuditEntry(*entry)
            return CancelOutcome(job_id, decided, status_after_cancel(decided, status), audit)

        outcome: CancelOutcome = await self._write(step)
        if ripple.released:  # a cancelled dependency released dependants that run anyway
            self.wakeups.notify()
        return outcome

    async def set_paused(self, queue: str, paused: bool, now_ms: int, note: str, actor: str) -> QueueAuditEntry:
        async def step(conn: Connection, schema: str) -> QueueAuditEntry:
            entry = await flow.set_paused(conn, schema, queue, paused, now_ms, note, actor)
            if not paused:  # waiting workers on every host look for work again
                await conn.execute(NOTIFY, self.wakeups.channel)
            return entry

        entry: QueueAuditEntry = await self._write(step)
        if not paused:
            self.wakeups.notify()
        return entry

    async def set_max_wait(
        self, queue: str, max_wait_ms: int | None, now_ms: int, note: str, actor: str
    ) -> QueueAuditEntry:
        entry: QueueAuditEntry = await self._write(flow.set_max_wait, queue, max_wait_ms, now_ms, note, actor)
        return entry

    async def set_retention(
        self, queue: str | None, task: str | None, windows: Windows | None, now_ms: int, note: str, actor: str
    ) -> QueueAuditEntry:
        entry: QueueAuditEntry = await self._write(flow.set_retention, queue, task, windows, now_ms, note, actor)
        return entry

    async def set_limits(self, queue: str, limits: Limits, now_ms: int, note: str, actor: str) -> QueueAuditEntry:
        async def step(conn: Connection, schema: str) -> QueueAuditEntry:
            entry = await flow.set_limits(conn, schema, queue, limits, now_ms, note, actor)
            await conn.execute(NOTIFY, self.wakeups.channel)  # a limit raised or cleared may let workers claim
            return entry

        entry: QueueAuditEntry = await self._write(step)
        self.wakeups.notify()
        return entry

    async def limit_usage(self, now_ms: int) -> list[LimitUsage]:
        found: list[LimitUsage] = await self._read(limits.limit_usage, now_ms)
        return found

    async def retention_rules(self) -> list[RetentionRule]:
        rules: list[RetentionRule] = await self._read(flow.retention_rules)
        return rules

    async def ended_groups(self, queues: Sequence[str] | None) -> list[tuple[str, str | None]]:
        groups: list[tuple[str, str | None]] = await self._read(retention.ended_groups, queues)
        return groups

    async def remove_expired(
        self, queue: str, task: str | None, state: str, cutoff_ms: int, now_ms: int, limit: int
    ) -> int:
        removed: int = await self._write(retention.remove_expired, queue, task, state, cutoff_ms, now_ms, limit)
        return removed

    async def queue_settings(self) -> list[QueueSettings]:
        found: list[QueueSettings] = await self._read(flow.all_settings)
        return found

    async def queue_audit(self, queue: str | None, limit: int) -> list[QueueAuditEntry]:
        entries: list[QueueAuditEntry] = await self._read(flow.audit_log, queue, limit)
        return entries

    async def get(self, job_id: str) -> Job | None:
        job: Job | None = await self._read(admin.get_job, job_id)
        return job

    async def list_jobs(self, which: JobFilter) -> list[Job]:
        jobs: list[Job] = await self._read(admin.list_jobs, which)
        return jobs

    async def history(self, job_id: str) -> list[AuditEntry]:
        entries: list[AuditEntry] = await self._read(admin.history, job_id)
        return entries

    async def audit_log(self, limit: int) -> list[AuditEntry]:
        entries: list[AuditEntry] = await self._read(admin.audit_log, limit)
        return entries

    async def stats(self, now_ms: int) -> Stats:
        stats: Stats = await self._read(admin.read_stats, now_ms)
        return stats

    async def prunable(self, cutoff_ms: int, statuses: Sequence[str], limit: int) -> tuple[dict[str, int], list[str]]:
        found: tuple[dict[str, int], list[str]] = await self._read(
            admin.prunable, admin.prune_params(cutoff_ms, statuses), limit
        )
        return found

    async def prune(self, cutoff_ms: int, statuses: Sequence[str], *, vacuum: bool, now_ms: int) -> PruneReport:
        """Delete in batches of ``admin.PRUNE_BATCH_ROWS``, each its own short transaction (no long lock, no
        table rewrite); the space goes back to the table for new rows (autovacuum marks it free), not to the
        file system: ``vacuum`` asks for none here (``VACUUM FULL`` would lock the table)."""
        self._check_writable()
        params = admin.prune_params(cutoff_ms, statuses)
        before = await self._read(admin.table_bytes)
        deleted, after, batches = 0, 0, 0
        while True:
            count, last = await self._write(admin.prune_batch, params, after)
            deleted, batches = deleted + count, batches + 1
            if last is None:
                break
            after = last
        await self._write(admin.prune_expired_results, now_ms)
        await self._write(admin.fold_counts)  # as every write: a server's failure is PostgresBusy
        return {
            "deleted": deleted,
            "batches": batches,
            "free_pages": None,
            "vacuum": "autovacuum",
            "bytes_before": before,
            "bytes_after": await self._read(admin.table_bytes),
        }

    async def backup(self, target: str, *, force: bool) -> BackupReport:
        raise NotImplementedError(
            f"{self.location} is a PostgreSQL store: back it up with the server's tools (pg_dump --schema="
            f"{self.schema}, or pg_basebackup and WAL archiving for point-in-time recovery)"
        )

    async def describe(self) -> StoreDescription:
        async def read(conn: Connection, schema: str) -> StoreDescription:
            version = await read_version(conn, schema, QUEUE.component)
            return {
                "store": "postgresql",
                "path": self.location,
                "schema": schema,
                "schema_version": version or 0,  # opening migrated it: never missing here
                "wakeups": self.wakeups.mode,
                "survives_power_loss": True,
                "settings": await settings(conn, admin.SETTINGS),
            }

        return await self._read(read)

    async def close(self) -> None:
        """Close after the transactions in progress (the pool waits for every connection to come back)."""
        await self.wakeups.close()
        await self._pool.close()

    @property
    def wakeup_losses(self) -> int:
        """Times this store's listening connection was lost or could not be opened (``Wakeups.lost``)."""
        return self.wakeups.lost

    def console(self) -> ConsoleStore:
        from asyncq.store.postgres.console_store import PostgresConsoleStore

        return PostgresConsoleStore(self)

    # -- helpers ------------------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.capabilities.read_only:
            raise StoreError(f"{self.location} was opened read-only")

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(conn, schema, *args)`` in one transaction on a pooled connection; transient failures as
        ``PostgresBusy``."""
        self._check_writable()
        try:
            async with self._pool.acquire() as conn, dropped_if_lost(conn), conn.transaction():
                return await fn(conn, self.schema, *args)
        except Exception as error:
            raise _translated(error, self.location) from None

    async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(conn, schema, *args)`` in one read-only ``REPEATABLE READ`` snapshot."""
        try:
            async with (
                self._pool.acquire() as conn,
                dropped_if_lost(conn),
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                return await fn(conn, self.schema, *args)
        except Exception as error:
            raise _translated(error, self.location) from None


def _translated(error: BaseException, location: str) -> BaseException:
    """``error`` itself, or the ``PostgresBusy`` it stands for (with ``error`` as its cause)."""
    busy = as_busy(error, location)
    if busy is not error:
        busy.__cause__ = error
    return busy
