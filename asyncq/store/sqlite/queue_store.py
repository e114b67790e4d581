"""``SqliteQueueStore``: the queue store's port on one SQLite file, over the engine's statements.

Every call is one engine transaction run whole in the connection's thread (``asyncq.store.sqlite.aio``); the
pool's group commit runs on the loop's thread once ``BEGIN IMMEDIATE`` holds the write lock (``_run_held``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

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
from asyncq.store.sqlite import admin, engine, flow, limits, offers, retention, wakeup
from asyncq.store.sqlite.aio import AsyncFile
from asyncq.store.sqlite.connection import check_path, configure, write_transaction
from asyncq.store.sqlite.durability import DEFAULT, LEVELS, Durability
from asyncq.store.sqlite.graph_store import GraphTransactionCalls, SqliteGraphCalls
from asyncq.store.sqlite.migrations import migrate_in_transaction, prepare_new_file
from asyncq.store.sqlite.schedules_store import SqliteSchedules
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import read_stats

# After a group commit that met the write lock held by another connection and claimed fewer jobs than it asked (it
# drained the queue), the next group commit waits this long after it. A writer elsewhere that enqueues one job at
# a time holds the lock most of the time; a pool that claimed again at once took the lock for a commit of a few
# jobs every 1-3 ms, and each of those commits held the writer up (one-at-a-time enqueues from another process:
# docs/benchmarks.md, "singles"). A claim that came back full (a backlog, pools taking turns) is never spaced.
CONTENDED_CLAIM_SPACING_S = 0.010

# The most jobs an enqueue carries into a pool's group commit. A group commit's statements run on the event loop's
# thread (``AsyncFile.run_held``); a larger batch is inserted in the connection's thread, the loop free meanwhile.
RIDE_ROWS_MAX = 64


def _open_and_migrate(con: sqlite3.Connection, level: Durability) -> None:
    prepare_new_file(con)
    configure(con, level.journal_mode, level.synchronous)
    # A row that ``INSERT OR REPLACE`` deletes (an app's SQL in ``transaction()``) fires the delete trigger that
    # keeps the job counts only with recursive triggers on (schema.JOB_COUNTS).
    con.execute("PRAGMA recursive_triggers = ON")
    with write_transaction(con):
        migrate_in_transaction(con)


def _check_reader(con: sqlite3.Connection, path: str) -> None:
    admin.check_version(admin.inspect(con, path), writing=False)


def _may_have_work(con: sqlite3.Connection) -> bool:
    """Whether a claim may find work another connection's commit left: some pending job (the first entry of the
    pending jobs' partial index), or a job offered to an idle pool (``core.offers``). A commit to an app's own table,
    or a job finished, wakes no idle pool."""
    return bool(con.execute(_WORK_LEFT).fetchone()[0])


_WORK_LEFT = (
    f"SELECT EXISTS (SELECT 1 FROM {PRODUCT.jobs} WHERE status = 'pending') OR EXISTS (SELECT 1 FROM asyncq_offered)"
)


def _level(durability: str | None, path: str) -> Durability:
    """The named level; ``None`` keeps an existing file's journal mode (a new file gets the default)."""
    if durability is None:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return DEFAULT
        with contextlib.closing(sqlite3.connect(admin.read_only_uri(path), uri=True)) as con:
            return LEVELS[admin.inspect(con, path, table=None).durability]
    level = LEVELS.get(durability)
    if level is None:
        raise ValueError(f"durability must be one of {sorted(LEVELS)}")
    return level


def _explained(error: sqlite3.OperationalError, path: str) -> Exception:
    """A read-only file, side file or directory named with what to do about it (SQLite names none of them)."""
    blocker = admin.read_only_part(path) if "readonly" in str(error) or "unable to open" in str(error) else None
    return error if blocker is None else StoreError(f"{path}: {blocker}")


class SqliteTransaction(GraphTransactionCalls):
    """An open ``BEGIN IMMEDIATE`` on the store's connection: the app's SQL and its jobs commit together."""

    async def enqueue_rows(self, rows: Sequence[NewJob]) -> list[Enqueued]:
        added: list[Enqueued] = await self._run_step(engine.enqueue_rows_in_transaction, PRODUCT, rows)
        self.added += sum(result is True for result in added)
        return added


class SqliteQueueStore(SqliteSchedules, SqliteGraphCalls):
    """The queue store's port on one SQLite file (see ``asyncq.store.port.queue`` for each method's rule)."""

    def __init__(self, file: AsyncFile, level: Durability, read_only: bool) -> None:
        self._file = file
        file.may_have_work = _may_have_work
        self.location = file.path
        self.level = level
        self.capabilities = Capabilities(
            backup=True, app_sql=True, survives_power_loss=level.survives_power_loss, read_only=read_only
        )
        self._limited: set[str] = set()  # the queues a claim found limited (a hint: each claim reads them again)

    @classmethod
    async def open(
        cls, path: object, *, durability: str | None = DEFAULT.name, busy_timeout: float = 5.0, read_only: bool = False
    ) -> SqliteQueueStore:
        """Open (creating and migrating unless ``read_only``) a queue file. ``read_only`` opens an existing
        current queue with ``mode=ro``: nothing can create or change it; ``StoreError`` if it is not one."""
        file = check_path(path)
        if read_only:
            return await cls._open_reader(file, busy_timeout)
        blocker = admin.read_only_part(file)  # at open, not at the first write: SQLite would open it and wait
        if blocker is not None:
            raise StoreError(f"{file}: {blocker}")
        level = _level(durability, file)
        try:
            conn = await AsyncFile.connect(file, busy_timeout, functools.partial(_open_and_migrate, level=level))
        except sqlite3.OperationalError as error:
            raise _explained(error, file) from error
        return cls(AsyncFile(conn, file), level, read_only=False)

    @classmethod
    async def _open_reader(cls, file: str, busy_timeout: float) -> SqliteQueueStore:
        """``mode=ro``; a closed WAL file in a directory we cannot write (SQLite would have to create ``-shm``) is
        opened ``immutable``: no writer can be at work there without the side files it would need."""
        check = functools.partial(_check_reader, path=file)
        try:
            conn = await AsyncFile.connect(admin.read_only_uri(file), busy_timeout, check, uri=True)
        except sqlite3.OperationalError as error:
            if not admin.may_open_immutable(file):
                raise _explained(error, file) from error
            conn = await AsyncFile.connect(admin.read_only_uri(file, immutable=True), busy_timeout, check, uri=True)
        store = cls(AsyncFile(conn, file), DEFAULT, read_only=True)
        found: admin.QueueFile = await store._file.run(admin.inspect, file)
        store.level = LEVELS[found.durability]
        return store

    # -- producers ----------------------------------------------------------------------------------------

    async def enqueue(self, rows: Sequence[NewJob], *, connection: object = None) -> list[Enqueued]:
        if connection is not None:
            raise TypeError(
                "a SQLite queue joins the app's transaction through queue.transaction(), or enqueue_sync on the"
                " app's own sqlite3 connection"
            )
        self._check_writable()
        added: list[Enqueued]
        if len(rows) <= RIDE_ROWS_MAX:  # beside a pool of this process, in its group commit (``write_or_ride``)
            added = await self._file.write_or_ride(engine.enqueue, engine.enqueue_rows_in_transaction, PRODUCT, rows)
        else:
            added = await self._file.run_write(engine.enqueue, PRODUCT, rows)
        if True in added:
            self._file.notify()
        return added

    def transaction(self) -> AbstractAsyncContextManager[StoreTransaction]:
        self._check_writable()
        return self._file.open_transaction(SqliteTransaction(self._file))

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
        self._check_writable()
        scoped = [({"queue": queue}, n) for queue, n in wants]
        begun = [(ticket.seq, ticket.id, ticket.fence) for ticket in started]
        ripple = Ripple()
        statuses, tickets, activated, holds = await self._file.run_held(
            engine.settle_and_claim_in_transaction,
            PRODUCT,
            finishes,
            now_ms,
            owner,
            lease_ms,
            scoped,
            total,
            start_now,
            begun,
            resend,
            self._limited,
            ripple,
            offer,
        )
        asked = sum(n for _queue, n in wants) if total is None else min(total, sum(n for _queue, n in wants))
        if self._file.begin_waited and len(tickets) < asked:
            self._file.space_next_held(CONTENDED_CLAIM_SPACING_S)
        self._notify_if_pending(statuses, ripple)
        return Settled(statuses, tickets, activated, holds)

    async def offered(self, owner: str, now_ms: int) -> list[Ticket]:
        rows = self._file.read_at_once(offers.offered_rows, owner, now_ms)
        if rows is None:  # the connection is busy: read in its turn
            rows = await self._file.run(offers.offered_rows, owner, now_ms)
        return offered_tickets(rows, owner)

    async def finish(self, finishes: Sequence[Finish], now_ms: int) -> list[str | None]:
        ripple = Ripple()
        statuses: list[str | None] = await self._write_first(engine.finish, PRODUCT, finishes, now_ms, ripple=ripple)
        self._notify_if_pending(statuses, ripple)
        return statuses

    def _notify_if_pending(self, statuses: Sequence[str | None], ripple: Ripple) -> None:
        """A retry makes a job pending again (ready at once if its delay is 0), and so does the end of a job that
        others waited for: wake this process's waiters."""
        if PENDING in statuses or ripple.released:
            self._file.notify()

    async def extend(self, leases: Sequence[tuple[str, Fence]], now_ms: int, lease_ms: int) -> list[Renewal | None]:
        renewed: list[Renewal | None] = await self._write_first(engine.extend, PRODUCT, leases, now_ms, lease_ms)
        return renewed

    async def release(
        self, leases: Sequence[tuple[str, Fence]], now_ms: int, counted: Sequence[bool] | None = None
    ) -> list[bool]:
        released: list[bool] = await self._write_first(engine.release, PRODUCT, leases, now_ms, counted)
        if any(released):
            self._file.notify()
        return released

    async def wait_for_work(self, timeout: float) -> None:
        await self._file.wait_for_rows(timeout)

    def host_rides(self, start: Callable[[], bool]) -> Callable[[], None]:
        return self._file.host_rides(start)

    # -- operators ----------------------------------------------------------------------------------------

    async def redrive(self, job_id: str, now_ms: int, deadline_ms: int, note: str) -> AuditEntry:
        def redrive(con: sqlite3.Connection) -> AuditEntry:
            engine.redrive(con, PRODUCT, job_id, now_ms, deadline_ms, note)
            return admin.last_audit_of(con, job_id)

        entry: AuditEntry = await self._write(redrive)
        self._file.notify()
        return entry

    async def cancel(self, job_id: str, now_ms: int, note: str) -> CancelOutcome:
        ripple = Ripple()

        def cancel(con: sqlite3.Connection) -> CancelOutcome:
            decided, audited, status = engine.cancel(con, PRODUCT, job_id, now_ms, note, ripple)
            entry = admin.last_audit_of(con, job_id) if audited else None
            return CancelOutcome(job_id, decided, status_after_cancel(decided, status), entry)

        outcome: CancelOutcome = await self._write(cancel)
        if ripple.released:  # a cancelled dependency released dependants that run anyway
            self._file.notify()
        return outcome

    async def set_paused(self, queue: str, paused: bool, now_ms: int, note: str, actor: str) -> QueueAuditEntry:
        entry: QueueAuditEntry = await self._write(flow.set_paused, queue, paused, now_ms, note, actor)
        if not paused:
            self._file.notify()
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
        entry: QueueAuditEntry = await self._write(flow.set_limits, queue, limits, now_ms, note, actor)
        self._file.notify()  # a limit raised or cleared may let waiting workers claim
        return entry

    async def limit_usage(self, now_ms: int) -> list[LimitUsage]:
        def read(con: sqlite3.Connection) -> list[LimitUsage]:
            con.execute("BEGIN")  # one snapshot: the limits and the leases they count agree
            try:
                return limits.limit_usage(con, now_ms)
            finally:
                con.execute("COMMIT")

        usage: list[LimitUsage] = await self._file.run(read)
        return usage

    async def retention_rules(self) -> list[RetentionRule]:
        rules: list[RetentionRule] = await self._file.run(flow.retention_rules)
        return rules

    async def ended_groups(self, queues: Sequence[str] | None) -> list[tuple[str, str | None]]:
        groups: list[tuple[str, str | None]] = await self._file.run(retention.ended_groups, queues)
        return groups

    async def remove_expired(
        self, queue: str, task: str | None, state: str, cutoff_ms: int, now_ms: int, limit: int
    ) -> int:
        removed: int = await self._write(retention.remove_expired, queue, task, state, cutoff_ms, now_ms, limit)
        return removed

    async def queue_settings(self) -> list[QueueSettings]:
        found: list[QueueSettings] = await self._file.run(flow.all_settings)
        return found

    async def queue_audit(self, queue: str | None, limit: int) -> list[QueueAuditEntry]:
        entries: list[QueueAuditEntry] = await self._file.run(flow.audit_log, queue, limit)
        return entries

    async def get(self, job_id: str) -> Job | None:
        job: Job | None = await self._file.run(admin.get_job, job_id)
        return job

    async def list_jobs(self, which: JobFilter) -> list[Job]:
        jobs: list[Job] = await self._file.run(admin.list_jobs, which)
        return jobs

    async def history(self, job_id: str) -> list[AuditEntry]:
        entries: list[AuditEntry] = await self._file.run(admin.history, job_id)
        return entries

    async def audit_log(self, limit: int) -> list[AuditEntry]:
        entries: list[AuditEntry] = await self._file.run(admin.audit_log, limit)
        return entries

    async def stats(self, now_ms: int) -> Stats:
        stats: Stats = await self._file.run(read_stats, PRODUCT, now_ms)
        return stats

    async def prunable(self, cutoff_ms: int, statuses: Sequence[str], limit: int) -> tuple[dict[str, int], list[str]]:
        found: tuple[dict[str, int], list[str]] = await self._file.run(
            admin.prunable, admin.prune_params(cutoff_ms, statuses, limit)
        )
        return found

    async def prune(self, cutoff_ms: int, statuses: Sequence[str], *, vacuum: bool, now_ms: int) -> PruneReport:
        params = admin.prune_params(cutoff_ms, statuses) | {"now": now_ms}
        done: PruneReport = await self._write(admin.prune, self.location, params, vacuum=vacuum)
        done["bytes_after"] = os.path.getsize(self.location)
        return done

    async def backup(self, target: str, *, force: bool) -> BackupReport:
        done: BackupReport = await self._file.run(functools.partial(admin.backup, force=force), self.location, target)
        return done

    async def describe(self) -> StoreDescription:
        found: StoreDescription = await self._file.run(admin.describe, self.location)
        found["durability"] = self.level.name
        found["survives_power_loss"] = self.level.survives_power_loss
        return found

    async def close(self) -> None:
        await self._file.close()

    @property
    def wakeup_losses(self) -> int:
        """This process's file watchers' failed sources (``wakeup.COUNTERS``): a file's watcher is shared by every
        queue of the process on it."""
        return wakeup.COUNTERS.failures

    def console(self) -> ConsoleStore:
        from asyncq.store.sqlite.console_store import SqliteConsoleStore

        return SqliteConsoleStore(self)

    # -- helpers ------------------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.capabilities.read_only:
            raise StoreError(f"{self.location} was opened read-only")

    async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._check_writable()
        return await self._file.run(functools.partial(fn, **kwargs) if kwargs else fn, *args)

    async def _write_first(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``_write`` for an engine call that begins with its write transaction (``AsyncFile.run_write``)."""
        self._check_writable()
        return await self._file.run_write(functools.partial(fn, **kwargs) if kwargs else fn, *args)
