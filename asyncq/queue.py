"""``Queue``: the async facade over one SQLite file (aiosqlite), running the lab's lifecycle unchanged.

All writes of one process go through one connection, one short ``BEGIN IMMEDIATE`` transaction at a
time, each run whole in the connection's thread (``asyncq.store.sqlite.aio``). Serialising writers inside
the process is deliberate: several connections contending for SQLite's write lock only sleep in its
busy handler (1, 2, 5 … 100 ms) while the holder re-takes the lock (see docs/architecture.md).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

import aiosqlite

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.jobs import (
    DEFAULT_LEASE_MS,
    DEFAULT_QUEUE,
    DEFAULT_TTL_MS,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_LEASE_MS,
    MAX_TTL_MS,
    Finish,
    Job,
    JobSpec,
    Ticket,
)
from asyncq.core.lifecycle import OUTCOMES
from asyncq.core.values import check_choice, check_identifier, check_int
from asyncq.store.sqlite import engine
from asyncq.store.sqlite.aio import AppTransaction, AsyncFile
from asyncq.store.sqlite.connection import configure, write_transaction
from asyncq.store.sqlite.durability import DEFAULT, LEVELS, Durability
from asyncq.store.sqlite.migrations import migrate_in_transaction, prepare_new_file
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import Stats, read_stats

log = logging.getLogger("asyncq.queue")
GET_JOB = f"SELECT {Job.COLUMNS} FROM {PRODUCT.jobs} WHERE id = ?"


def _open_and_migrate(con: sqlite3.Connection, level: Durability) -> None:
    prepare_new_file(con)
    configure(con, level.journal_mode, level.synchronous)
    with write_transaction(con):
        migrate_in_transaction(con)


class Transaction(AppTransaction):
    """An open ``BEGIN IMMEDIATE`` on the queue's connection: the app's SQL and its jobs commit together."""

    _file: Queue

    async def enqueue(self, job_id: str, body: Any, **options: Any) -> bool:
        """Enqueue inside this transaction (see ``Queue.enqueue``)."""
        row = JobSpec(job_id, body, **options).to_row(self._file.now(), self._file.max_body_bytes)
        added = await self._run_step(engine.enqueue_in_transaction, PRODUCT, row)
        self.added += added
        return added


class Queue(AsyncFile):
    """A durable job queue in one SQLite file. Open with ``await Queue.open(path)``."""

    def __init__(
        self, conn: aiosqlite.Connection, path: str, durability: Durability, clock: Clock, max_body_bytes: int
    ) -> None:
        super().__init__(conn, path, clock)
        self.durability = durability
        self.max_body_bytes = max_body_bytes

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        durability: str = DEFAULT.name,
        clock: Clock = wall_clock_ms,
        busy_timeout: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> Queue:
        """Open (creating and migrating if needed) a queue file. ``durability`` is ``full`` (WAL+FULL, the
        default), ``full-delete`` (DELETE+EXTRA) or ``normal`` (WAL+NORMAL: may lose the last commits on
        power loss)."""
        level = LEVELS.get(durability)
        if level is None:
            raise ValueError(f"durability must be one of {sorted(LEVELS)}")
        conn, file = await cls._connect(path, busy_timeout, lambda con: _open_and_migrate(con, level))
        return cls(conn, file, level, clock, max_body_bytes)

    # -- producers ------------------------------------------------------------------------------------

    async def enqueue(
        self,
        job_id: str,
        body: Any,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = 3,
        ttl_ms: int = DEFAULT_TTL_MS,
        delay_ms: int = 0,
    ) -> bool:
        """Add a job; ``False`` if the same id and body exist already, ``Conflict`` for another body."""
        return (await self.enqueue_many([JobSpec(job_id, body, queue, max_attempts, ttl_ms, delay_ms)]))[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[bool]:
        """Add several jobs in one transaction: all or none."""
        now = self.now()
        rows = [job.to_row(now, self.max_body_bytes) for job in jobs]
        added: list[bool] = await self._run(engine.enqueue, PRODUCT, rows)
        if any(added):
            self._notify()
        if log.isEnabledFor(logging.DEBUG):
            for row, new in zip(rows, added, strict=True):
                log.debug("job %s -> pending (enqueued)" if new else "job %s exists with the same body", row.id)
        return added

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """``async with queue.transaction() as tx``: ``tx.execute`` the app's SQL and ``tx.enqueue`` jobs;
        all commit together, or all roll back if the block raises (or is cancelled)."""
        return self._transaction(Transaction(self))

    # -- workers --------------------------------------------------------------------------------------

    async def claim(
        self, owner: str, *, queue: str = DEFAULT_QUEUE, limit: int = 1, lease_ms: int = DEFAULT_LEASE_MS
    ) -> list[Ticket]:
        """Lease up to ``limit`` ready jobs of ``queue`` in one transaction, each with its own token."""
        check_int(limit, "limit", 1, MAX_BATCH)
        _statuses, tickets = await self.settle_and_claim([], owner, [(queue, limit)], lease_ms)
        return tickets

    async def finish(self, ticket: Ticket, outcome: str, delay_ms: int = 0) -> str | None:
        """Record one outcome (``ok``, ``retry``, ``permanent``); the new status, or ``None`` if stale."""
        return (await self.finish_many([(ticket, outcome, delay_ms)]))[0]

    async def finish_many(self, results: Sequence[tuple[Ticket, str, int]]) -> list[str | None]:
        """Record several outcomes in one commit, each fenced on its own (stale ones change nothing)."""
        items = [_finish_item(ticket, outcome, delay_ms) for ticket, outcome, delay_ms in results]
        if not items:
            return []
        statuses: list[str | None] = await self._run(lambda con: engine.finish(con, PRODUCT, items, self.now()))
        return statuses

    async def settle_and_claim(
        self,
        results: Sequence[tuple[Ticket, str, int]],
        owner: str,
        wants: Sequence[tuple[str, int]],
        lease_ms: int = DEFAULT_LEASE_MS,
        total: int | None = None,
    ) -> tuple[list[str | None], list[Ticket]]:
        """Finish ``results`` and claim up to ``n`` jobs for each ``(queue, n)`` of ``wants`` (and at most
        ``total`` over all of them, if given) in one commit: the worker pool's group commit."""
        check_identifier(owner, "owner")
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        items = [_finish_item(ticket, outcome, delay_ms) for ticket, outcome, delay_ms in results]
        scoped = [({"queue": check_identifier(q, "queue")}, check_int(n, "n", 0, MAX_BATCH)) for q, n in wants]
        if total is not None:
            check_int(total, "total", 0, MAX_BATCH)
        statuses, claimed = await self._run_held(
            lambda con: engine.settle_and_claim_in_transaction(
                con, PRODUCT, items, self.now(), owner, lease_ms, scoped, total
            )
        )
        return statuses, [Ticket.from_row(row) for row in claimed]

    async def extend(self, ticket: Ticket, lease_ms: int = DEFAULT_LEASE_MS) -> Ticket | None:
        """Renew a held lease; the renewed ticket, or ``None`` if the lease is lost."""
        return (await self.extend_many([ticket], lease_ms))[0]

    async def extend_many(self, tickets: Sequence[Ticket], lease_ms: int = DEFAULT_LEASE_MS) -> list[Ticket | None]:
        """Renew several held leases in one commit; ``None`` for each one that is lost."""
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        leases = [(ticket.id, ticket.fence) for ticket in tickets]
        fences = await self._run(lambda con: engine.extend(con, PRODUCT, leases, self.now(), lease_ms))
        return [
            None if fence is None else replace(ticket, fence=fence)
            for ticket, fence in zip(tickets, fences, strict=True)
        ]

    async def release_many(self, tickets: Sequence[Ticket]) -> list[bool]:
        """Give back leases on jobs this worker claimed but never started (they are ``pending`` again, the
        attempt not counted); ``False`` for each lease no longer held."""
        leases = [(ticket.id, ticket.fence) for ticket in tickets]
        released: list[bool] = await self._run(lambda con: engine.release(con, PRODUCT, leases, self.now()))
        if any(released):
            self._notify()
        return released

    async def reconcile(self, ticket: Ticket) -> str | None:
        """After a finish whose outcome is unknown (cancelled while committing): the status it left, or
        ``None`` if it cannot be told from the row: the ticket still holds the lease (the finish did not land),
        or the job has since been claimed again under a newer token (finishing this ticket again is refused
        as stale either way)."""
        job = await self.get(ticket.id)
        if job is None or job.token != ticket.token:
            return None
        return None if job.status == "leased" and job.lease_until == ticket.lease_until else job.status

    # -- operators ------------------------------------------------------------------------------------

    async def redrive(self, job_id: str, note: str, *, ttl_ms: int = DEFAULT_TTL_MS) -> bool:
        """Re-arm a dead job with a fresh budget and an audit row; ``ValueError`` if it is not dead."""
        check_identifier(job_id, "job_id")
        check_identifier(note, "note")
        check_int(ttl_ms, "ttl_ms", 1, MAX_TTL_MS)
        now = self.now()
        done: bool = await self._run(engine.redrive, PRODUCT, job_id, now, now + ttl_ms, note)
        log.info("job %s dead -> pending (redriven: %s)", job_id, note)
        self._notify()
        return done

    async def cancel(self, job_id: str, note: str) -> bool:
        """Park a pending job as dead (reason ``cancelled``), audited; ``ValueError`` if not pending."""
        check_identifier(job_id, "job_id")
        check_identifier(note, "note")
        done: bool = await self._run(engine.cancel, PRODUCT, job_id, self.now(), note)
        log.info("job %s pending -> dead (cancelled: %s)", job_id, note)
        return done

    async def get(self, job_id: str) -> Job | None:
        """One job's stored record, or ``None``."""
        check_identifier(job_id, "job_id")
        row = await self._run(lambda con: con.execute(GET_JOB, (job_id,)).fetchone())
        return None if row is None else Job.from_row(tuple(row))

    async def stats(self) -> Stats:
        """Counts by status and dead reason, oldest pending age, leases by owner."""
        now = self.now()
        result: Stats = await self._run(read_stats, PRODUCT, now)
        return result


def _finish_item(ticket: Ticket, outcome: str, delay_ms: int) -> Finish:
    check_choice(outcome, "outcome", OUTCOMES)
    check_int(delay_ms, "delay_ms", 0, MAX_TTL_MS)
    return Finish(ticket.id, ticket.fence, outcome, delay_ms, ticket.held)
