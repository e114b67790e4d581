"""``Queue``: the async facade over a queue store. It checks every argument, reads the injected clock, and hands
the store (``asyncq.store.port.QueueStore``) only checked values and ``now``.

On PostgreSQL every call is one transaction on a connection of the store's pool. On SQLite all writes of one
process go through one connection, one short ``BEGIN IMMEDIATE`` transaction at a time. Serialising writers
inside the process is deliberate: several connections contending for SQLite's write lock only sleep in its busy
handler (1, 2, 5 … 100 ms) while the holder re-takes the lock (docs/benchmarks.md, "How the design was measured").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, NamedTuple, TypedDict, Unpack

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.failures import ErrorText, error_text
from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.jobs import (
    DEFAULT_LEASE_MS,
    DEFAULT_QUEUE,
    DEFAULT_TTL_MS,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_LEASE_MS,
    MAX_TTL_MS,
    AuditEntry,
    CancelOutcome,
    EnqueueOptions,
    Finish,
    Job,
    JobSpec,
    Settled,
    StoredResult,
    Ticket,
)
from asyncq.core.jsontext import JSONInput
from asyncq.core.lifecycle import DEAD, DONE, OUTCOMES, STATUSES, CancelState, Outcome, OutcomeName
from asyncq.core.limits import MAX_BUSY_TIMEOUT_SECONDS, MAX_WAIT_MS
from asyncq.core.stats import Stats
from asyncq.core.values import (
    Duration,
    check_choice,
    check_duration,
    check_identifier,
    check_int,
    check_note,
    duration_ms,
)
from asyncq.errors import StoreError
from asyncq.store.facade import StoreFacade
from asyncq.store.opening import inspect_queue_store, open_queue_store
from asyncq.store.port.queue import JobFilter, QueueStore, StoreState, StoreTransaction
from asyncq.store.port.reports import BackupReport, PruneReport, StoreDescription

log = logging.getLogger("asyncq.queue")


class QueueOptions(TypedDict, total=False):
    """``Queue.open``'s options after the path, by keyword (``asyncq.open`` takes the same)."""

    durability: str | None
    clock: Clock
    busy_timeout: float
    max_body_bytes: int
    read_only: bool


class Attempt(NamedTuple):
    """A finished attempt as ``finish_many`` and the group commit take it (a plain tuple in this order is accepted
    too): its ticket, its outcome, the wait before a retry in ms, the attempt's error kept with the job, and what a
    task returned (kept if the finish lands as ``done``)."""

    ticket: Ticket
    outcome: Outcome | OutcomeName
    delay_ms: int = 0
    error: BaseException | ErrorText | None = None
    result: StoredResult | None = None


class Claimed(NamedTuple):
    """What ``settle_and_claim`` did: the new status of each finish (``None``: stale) and the tickets claimed."""

    statuses: list[str | None]
    tickets: list[Ticket]


class Renewed(NamedTuple):
    """A renewed lease: the ticket holding it now, and whether a cancel of its job was requested."""

    ticket: Ticket
    cancel_requested: bool


class Prunable(NamedTuple):
    """What ``prune`` would delete now: counts by status, and the first ids."""

    by_status: dict[str, int]
    ids: list[str]


class Transaction:
    """An open transaction of the queue's store: the app's SQL (``execute``) and its jobs (``enqueue``) commit
    together. Usable only inside its ``async with`` block."""

    def __init__(self, queue: Queue, inner: StoreTransaction) -> None:
        self._queue = queue
        self._inner = inner

    @property
    def queue(self) -> Queue:
        """The queue this transaction belongs to."""
        return self._queue

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows, in the store's dialect (SQLite: ``?`` or
        ``:name`` parameters; PostgreSQL: ``$1``, ``$2`` … from a list or tuple)."""
        return await self._inner.execute(statement, parameters)

    async def enqueue(self, job_id: str, body: JSONInput, **options: Unpack[EnqueueOptions]) -> bool:
        """Enqueue inside this transaction (see ``Queue.enqueue``)."""
        row = JobSpec(job_id, body, **options).to_row(self._queue.now(), self._queue.max_body_bytes)
        return (await self._inner.enqueue_rows([row]))[0]


class Queue(StoreFacade[QueueStore]):
    """A durable job queue. Open with ``await Queue.open(path)`` for a SQLite file, or
    ``await Queue.open("postgresql://…")`` for PostgreSQL (``async with`` closes it)."""

    def __init__(self, store: QueueStore, clock: Clock = wall_clock_ms, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(store, clock)
        self.max_body_bytes = check_int(max_body_bytes, "max_body_bytes", 1, MAX_BODY_BYTES)
        self._ended = asyncio.Event()  # set (and replaced) when a finish in this process ends a job
        self._cancels = asyncio.Event()  # set (and replaced) when a cancel in this process stores a request

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: str | None = "full",
        clock: Clock = wall_clock_ms,
        busy_timeout: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        read_only: bool = False,
    ) -> Queue:
        """Open (creating and migrating if needed) a queue: a path is a SQLite file, a ``postgresql://`` URL a
        PostgreSQL schema (``?schema=`` names it, ``asyncq`` by default). For a SQLite file, ``durability`` is ``full``
        (WAL+FULL, the default), ``full-delete`` (DELETE+EXTRA), ``normal`` (WAL+NORMAL: may lose the last
        commits on power loss) or ``None`` (keep the file's journal mode). ``read_only`` opens an existing queue
        that nothing may change (``StoreError`` if it is not one)."""
        if not callable(clock):
            raise TypeError("clock must be a callable returning epoch milliseconds")
        check_int(max_body_bytes, "max_body_bytes", 1, MAX_BODY_BYTES)
        check_duration(busy_timeout, "busy_timeout", 0.0, MAX_BUSY_TIMEOUT_SECONDS)
        _flag(read_only, "read_only")
        store = await open_queue_store(path, durability=durability, busy_timeout=busy_timeout, read_only=read_only)
        return cls(store, clock, max_body_bytes)

    # -- producers ------------------------------------------------------------------------------------

    async def enqueue(
        self,
        job_id: str,
        body: JSONInput,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = 3,
        ttl: Duration | None = None,
        delay: Duration | None = None,
        priority: int = 0,
        connection: Any = None,
    ) -> bool:
        """Add a job; ``False`` if the same id and body exist already, ``Conflict`` for another body. ``ttl``
        (default a day) and ``delay`` are seconds or a ``timedelta``; ``priority`` (-100 … 100) orders the queue,
        higher first (``docs/flow-control.md``).

        ``connection``: on PostgreSQL, the app's own asyncpg connection with its transaction open (``async with
        conn.transaction(): … await queue.enqueue(…, connection=conn)``): the job commits or rolls back with the
        app's rows. On SQLite, use ``transaction()`` (or ``enqueue_sync`` on the app's ``sqlite3`` connection)."""
        spec = JobSpec(job_id, body, queue, max_attempts, ttl=ttl, delay=delay, priority=priority)
        return (await self.enqueue_many([spec], connection=connection))[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec], *, connection: Any = None) -> list[bool]:
        """Add several jobs in one transaction: all or none (in the app's, with ``connection``: see ``enqueue``)."""
        now = self.now()
        rows = [_spec(job).to_row(now, self.max_body_bytes) for job in jobs]
        added = await self.store.enqueue(rows, connection=connection)
        if log.isEnabledFor(logging.DEBUG):
            for row, new in zip(rows, added, strict=True):
                log.debug("job %s -> pending (enqueued)" if new else "job %s exists with the same body", row.id)
        return added

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """``async with queue.transaction() as tx``: ``tx.execute`` the app's SQL and ``tx.enqueue`` jobs;
        all commit together, or all roll back if the block raises (or is cancelled)."""
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        async with self.store.transaction() as inner:
            yield Transaction(self, inner)

    # -- workers --------------------------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        *,
        queue: str = DEFAULT_QUEUE,
        limit: int = 1,
        lease: Duration | None = None,
    ) -> list[Ticket]:
        """Lease up to ``limit`` ready jobs of ``queue`` in one transaction, each with its own token; ``lease`` in
        seconds (default 30)."""
        check_int(limit, "limit", 1, MAX_BATCH)
        lease_ms = duration_ms(lease, "lease", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
        _statuses, tickets = await self.settle_and_claim([], owner, [(queue, limit)], lease_ms)
        return tickets

    async def finish(
        self,
        ticket: Ticket,
        outcome: Outcome | OutcomeName,
        *,
        delay: Duration | None = None,
        error: BaseException | None = None,
    ) -> str | None:
        """Record one outcome (``ok``, ``retry``, ``permanent``); the new status, or ``None`` if stale. ``delay``
        (seconds) is the wait before a retry; ``error`` (a failed attempt's exception) is kept with the job.
        Durations are keyword-only, so that a call written for the older milliseconds fails loudly."""
        delay_ms = duration_ms(delay, "delay", 0, 0, MAX_TTL_MS)
        return (await self.finish_many([Attempt(ticket, outcome, delay_ms, error)]))[0]

    async def finish_many(self, results: Sequence[Attempt]) -> list[str | None]:
        """Record several outcomes (``Attempt(ticket, outcome, delay_ms)``, optionally the attempt's error) in one
        commit, each fenced on its own (stale ones change nothing). The batch API takes the store's unit,
        milliseconds, like ``settle_and_claim``: it is what a worker pool sends."""
        items = [_finish_item(*result) for result in _results(results)]
        if not items:
            return []
        return self._note_ends(await self.store.finish(items, self.now()))

    async def settle_and_claim(
        self,
        results: Sequence[Attempt],
        owner: str,
        wants: Sequence[tuple[str, int]],
        lease_ms: int = DEFAULT_LEASE_MS,
        total: int | None = None,
    ) -> Claimed:
        """Finish ``results`` and claim up to ``n`` jobs for each ``(queue, n)`` of ``wants`` (and at most
        ``total`` over all of them, if given) in one commit, every claimed job's attempt counted."""
        settled = await self.commit_cycle(results, owner, wants, lease_ms, total)
        return Claimed(settled.statuses, settled.tickets)

    async def commit_cycle(
        self,
        results: Sequence[Attempt],
        owner: str,
        wants: Sequence[tuple[str, int]],
        lease_ms: int = DEFAULT_LEASE_MS,
        total: int | None = None,
        *,
        start_now: int | None = None,
        started: Sequence[Ticket] = (),
        resend: bool = False,
    ) -> Settled:
        """The worker pool's group commit: ``settle_and_claim``, where only the first ``start_now`` claimed jobs
        (those for free slots) count an attempt at once, and the jobs claimed ahead that handlers have
        ``started`` since count theirs now (``QueueStore.settle_and_claim``). ``resend``: the results were sent
        before by a call whose commit may have landed (``StoreBusy.may_have_landed``)."""
        check_identifier(owner, "owner")
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        items = [_finish_item(*result) for result in _results(results)]
        checked = [(check_identifier(q, "queue"), check_int(n, "n", 0, MAX_BATCH)) for q, n in wants]
        if total is not None:
            check_int(total, "total", 0, MAX_BATCH)
        if start_now is not None:
            check_int(start_now, "start_now", 0, MAX_BATCH)
        begun = [_ticket(ticket) for ticket in started]
        settled = await self.store.settle_and_claim(
            items, self.now(), owner, lease_ms, checked, total, start_now=start_now, started=begun, resend=resend
        )
        self._note_ends(settled.statuses)
        return settled

    def _note_ends(self, statuses: list[str | None]) -> list[str | None]:
        """Wake ``wait_for_end`` callers if one of these finishes ended a job (done or dead)."""
        if DONE in statuses or DEAD in statuses:
            ended, self._ended = self._ended, asyncio.Event()
            ended.set()
        return statuses

    async def wait_for_end(self, timeout: float) -> None:
        """Return when a finish in this process ends a job, or after ``timeout`` seconds (the fallback for jobs
        that end in another process, or by the sweep)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ended.wait()

    async def extend(self, ticket: Ticket, *, lease: Duration | None = None) -> Ticket | None:
        """Renew a held lease by ``lease`` seconds (default 30); the renewed ticket, or ``None`` if it is lost."""
        lease_ms = duration_ms(lease, "lease", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
        return (await self.extend_many([ticket], lease_ms))[0]

    async def extend_many(self, tickets: Sequence[Ticket], lease_ms: int = DEFAULT_LEASE_MS) -> list[Ticket | None]:
        """Renew several held leases in one commit; ``None`` for each one that is lost (the batch API: ms)."""
        return [None if renewed is None else renewed.ticket for renewed in await self.renew_many(tickets, lease_ms)]

    async def renew_many(self, tickets: Sequence[Ticket], lease_ms: int = DEFAULT_LEASE_MS) -> list[Renewed | None]:
        """``extend_many``, each renewed ticket with whether a cancel of its job was requested (``Queue.cancel``):
        what a pool's renewal reads, in the renewal's own fenced statement; ``None`` for each lease lost."""
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        tickets = [_ticket(ticket) for ticket in tickets]
        leases = [(ticket.id, ticket.fence) for ticket in tickets]
        renewals = await self.store.extend(leases, self.now(), lease_ms)
        return [
            None if renewal is None else Renewed(replace(ticket, fence=renewal.fence), renewal.cancel_requested)
            for ticket, renewal in zip(tickets, renewals, strict=True)
        ]

    async def release_many(self, tickets: Sequence[Ticket]) -> list[bool]:
        """Give back leases on jobs this worker claimed but never started (they are ``pending`` again, the
        attempt not counted); ``False`` for each lease no longer held."""
        checked = [_ticket(ticket) for ticket in tickets]
        leases = [(ticket.id, ticket.fence) for ticket in checked]
        return await self.store.release(leases, self.now(), [ticket.counted for ticket in checked])

    async def reconcile(self, ticket: Ticket) -> str | None:
        """After a finish whose outcome is unknown (cancelled while committing): the status it left, or
        ``None`` if it cannot be told from the row: the ticket still holds the lease (the finish did not land),
        or the job has since been claimed again under a newer token (finishing this ticket again is refused
        as stale either way)."""
        ticket = _ticket(ticket)
        job = await self.get(ticket.id)
        if job is None or job.token != ticket.token:
            return None
        return None if job.status == "leased" and job.lease_until == ticket.lease_until else job.status

    async def wait_for_rows(self, timeout: float) -> None:
        """Return when new work may be ready, or after ``timeout`` seconds."""
        await self.store.wait_for_work(timeout)

    # -- operators ------------------------------------------------------------------------------------

    async def redrive(self, job_id: str, note: str, *, ttl: Duration | None = None) -> AuditEntry:
        """Re-arm a dead job with a fresh budget (a deadline ``ttl`` seconds away, default a day); its audit row.
        ``ValueError`` if it is not dead."""
        check_identifier(job_id, "job_id")
        check_note(note)
        ttl_ms = duration_ms(ttl, "ttl", DEFAULT_TTL_MS, 1, MAX_TTL_MS)
        now = self.now()
        entry = await self.store.redrive(job_id, now, now + ttl_ms, note)
        log.info("job %s dead -> pending (redriven: %s)", job_id, note)
        return entry

    async def cancel(self, job_id: str, note: str) -> CancelOutcome:
        """Cancel a job, whatever it is doing; ``.state`` says what happened. ``cancelled``: it was pending (or its
        lease had expired) and is dead now (reason ``cancelled``). ``requested``: a worker holds it; a cancel
        request is stored on its row, and the pool holding it cancels its handler at its next lease renewal (or
        at once, in this process) and finishes it dead (``cancelled``); if its lease expires first, it is not run
        again. ``too_late``: it had ended (done or dead). Audited (``cancel``, ``cancel_request``); ``ValueError``
        if there is no such job."""
        check_identifier(job_id, "job_id")
        check_note(note)
        outcome = await self.store.cancel(job_id, self.now(), note)
        if outcome.state is CancelState.REQUESTED:  # a pool of this process holding the job looks at once
            requested, self._cancels = self._cancels, asyncio.Event()
            requested.set()
        log.info("job %s: cancel %s (%s)", job_id, outcome.state, note)
        return outcome

    async def wait_for_cancel_request(self, timeout: float) -> bool:
        """Wait until a cancel in this process asks a running job to stop (``True``), or ``timeout`` seconds
        (``False``; a request from another process is read by the holder's next lease renewal)."""
        requested = self._cancels
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await requested.wait()
        return requested.is_set()

    async def pause(self, queue: str, *, note: str, by: str | None = None) -> QueueAuditEntry:
        """Stop every process on every host from claiming ``queue``'s jobs, from the first claim that begins after
        this returns (jobs in flight finish); stored, so it lasts until ``resume``, across restarts. ``by`` names
        who paused it (default this process: ``pid N on HOST``); its audit row. ``ValueError`` if already paused."""
        return await self._set_paused(queue, True, note, by)

    async def resume(self, queue: str, *, note: str, by: str | None = None) -> QueueAuditEntry:
        """Let ``queue``'s jobs be claimed again; its audit row. ``ValueError`` if it is not paused."""
        return await self._set_paused(queue, False, note, by)

    async def _set_paused(self, queue: str, paused: bool, note: str, by: str | None) -> QueueAuditEntry:
        check_identifier(queue, "queue")
        check_note(note)
        actor = _actor(by)
        entry = await self.store.set_paused(queue, paused, self.now(), note, actor)
        log.info("queue %s %s by %s: %s", queue, "paused" if paused else "resumed", actor, note)
        return entry

    async def set_max_wait(
        self, queue: str, max_wait: Duration | None, *, note: str | None = None, by: str | None = None
    ) -> QueueAuditEntry:
        """Bound a low priority's wait on ``queue``: a job ready longer than ``max_wait`` seconds (or a
        ``timedelta``) is claimed before fresher higher-priority jobs; ``None`` clears it (strict priorities).
        Stored and audited like a pause."""
        check_identifier(queue, "queue")
        max_wait_ms = None if max_wait is None else duration_ms(max_wait, "max_wait", 0, 1, MAX_WAIT_MS)
        checked = (
            check_note(note) if note is not None else f"max_wait {'none' if max_wait_ms is None else max_wait_ms} ms"
        )
        return await self.store.set_max_wait(queue, max_wait_ms, self.now(), checked, _actor(by))

    async def queue_settings(self) -> list[QueueSettings]:
        """Every queue's stored flow-control settings (paused: since when, by whom, why; ``max_wait``), by name."""
        return await self.store.queue_settings()

    async def paused_queues(self) -> list[QueueSettings]:
        """The settings of the queues paused now."""
        return [settings for settings in await self.queue_settings() if settings.paused]

    async def queue_audit(self, queue: str | None = None, *, limit: int = 100) -> list[QueueAuditEntry]:
        """The newest moves on queues (pause, resume, max_wait), of ``queue`` only if named, newest first."""
        if queue is not None:
            check_identifier(queue, "queue")
        return await self.store.queue_audit(queue, check_int(limit, "limit", 1, MAX_BATCH))

    async def get(self, job_id: str) -> Job | None:
        """One job's stored record, or ``None``."""
        return await self.store.get(check_identifier(job_id, "job_id"))

    async def list_jobs(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        after: int = 0,
        limit: int = 100,
        newest: bool = False,
        body: bool = True,
        errors: bool = False,
    ) -> list[Job]:
        """Jobs filtered by status, queue and reason (``None``: any), oldest first after ``seq = after``, or
        ``newest`` first; at most ``limit`` (1-1001). ``errors`` fills each job's newest failed attempt's error."""
        if status is not None:
            check_choice(status, "status", STATUSES)
        if queue is not None:
            check_identifier(queue, "queue")
        if reason is not None:
            check_identifier(reason, "reason")
        check_int(after, "after", 0, 2**63 - 1)
        check_int(limit, "limit", 1, MAX_BATCH + 1)
        flags = _flag(newest, "newest"), _flag(body, "body"), _flag(errors, "errors")
        which = JobFilter(status, queue, reason, after, limit, *flags)
        return await self.store.list_jobs(which)

    async def history(self, job_id: str) -> list[AuditEntry]:
        """One job's audit rows (redrives, cancels), oldest first."""
        return await self.store.history(check_identifier(job_id, "job_id"))

    async def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The newest audit rows of the whole queue, newest first."""
        return await self.store.audit_log(check_int(limit, "limit", 1, MAX_BATCH))

    async def stats(self) -> Stats:
        """Counts by status and dead reason, oldest pending age, leases by owner."""
        return await self.store.stats(self.now())

    async def prunable(
        self, older_than: Duration, statuses: Sequence[str] = ("done", "dead"), limit: int = -1
    ) -> Prunable:
        """What ``prune`` would delete now: counts by status, and the first ``limit`` ids (``-1``: all)."""
        check_int(limit, "limit", -1, 2**31)
        return Prunable(*await self.store.prunable(self._cutoff(older_than), _prune_statuses(statuses), limit))

    async def prune(
        self, older_than: Duration, statuses: Sequence[str] = ("done", "dead"), *, vacuum: bool = False
    ) -> PruneReport:
        """Delete the done/dead jobs that ended longer than ``older_than`` seconds ago (audit rows stay), with their
        tasks' results, and every result kept past its task's retention (its job stays until its own prune)."""
        cutoff = self._cutoff(older_than)
        checked = _prune_statuses(statuses)
        return await self.store.prune(cutoff, checked, vacuum=_flag(vacuum, "vacuum"), now_ms=self.now())

    async def backup(self, target: str, *, force: bool = False) -> BackupReport:
        """An online, checked copy of the store at ``target`` (stores with ``capabilities.backup``)."""
        return await self.store.backup(target, force=_flag(force, "force"))  # others say what to use instead

    async def describe(self) -> StoreDescription:
        """What the store is: its kind, schema version and settings."""
        return await self.store.describe()

    def _cutoff(self, older_than: Duration) -> int:
        return self.now() - duration_ms(older_than, "older_than", 0, 0, MAX_TTL_MS * 100)

    # -- opening what exists --------------------------------------------------------------------------

    @classmethod
    async def inspect(cls, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> StoreState:
        """What ``path`` holds (missing, empty, an app's tables only, or a queue at some schema version), found
        without creating or changing anything; ``StoreError`` if it is not a store at all."""
        return await inspect_queue_store(path, busy_timeout=busy_timeout)

    @classmethod
    async def open_existing(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Clock = wall_clock_ms,
        busy_timeout: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> Queue:
        """Open a queue that exists already, for writing, keeping its journal mode (an older schema is migrated):
        ``StoreError``, with nothing created or changed, if ``path`` is missing, not a queue, or newer."""
        problem = (await cls.inspect(path, busy_timeout=busy_timeout)).problem
        if problem is not None:
            raise StoreError(problem)
        return await cls.open(
            path, durability=None, clock=clock, busy_timeout=busy_timeout, max_body_bytes=max_body_bytes
        )


def _actor(by: str | None) -> str:
    """Who makes an operator's move: ``by`` (a note's text rules), or this process."""
    return f"pid {os.getpid()} on {socket.gethostname()}" if by is None else check_note(by, "by")


def _flag(value: object, name: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _prune_statuses(statuses: Sequence[str]) -> tuple[str, ...]:
    checked = tuple(check_choice(status, "statuses", ("done", "dead")) for status in statuses)
    if not checked:
        raise ValueError("statuses must name done, dead or both")
    return checked


def _spec(job: object) -> JobSpec:
    if type(job) is not JobSpec:
        raise TypeError(f"enqueue_many takes JobSpec values, not {type(job).__name__}")
    return job


def _ticket(ticket: object) -> Ticket:
    if type(ticket) is not Ticket:
        raise TypeError(f"expected a Ticket from claim(), not {type(ticket).__name__}")
    return ticket


def _results(results: Sequence[Attempt]) -> Sequence[Attempt]:
    for result in results:
        if not isinstance(result, tuple) or len(result) not in (3, 4, 5):
            raise TypeError("results must be (ticket, outcome, delay_ms[, error[, result]]) tuples")
    return results


def _finish_item(
    ticket: Ticket,
    outcome: str,
    delay_ms: int,
    error: BaseException | ErrorText | None = None,
    result: StoredResult | None = None,
) -> Finish:
    if (  # what a pool sends, checked in one expression (a group commit checks every job's result)
        type(ticket) is Ticket
        and type(outcome) is str
        and outcome in _OUTCOME_VALUES
        and type(delay_ms) is int
        and 0 <= delay_ms <= MAX_TTL_MS
        and (error is None or type(error) is ErrorText)
        and (result is None or type(result) is StoredResult)
    ):
        return tuple.__new__(
            Finish, (ticket.id, ticket.fence, outcome, delay_ms, ticket.held, error, ticket.counted, result)
        )
    _ticket(ticket)
    if result is not None and type(result) is not StoredResult:
        raise TypeError(f"result must be a StoredResult, not {type(result).__name__}")
    check_choice(outcome, "outcome", OUTCOMES)
    check_int(delay_ms, "delay_ms", 0, MAX_TTL_MS)
    if isinstance(error, BaseException):
        error = error_text(error)
    elif error is not None and type(error) is not ErrorText:
        raise TypeError(f"error must be an exception, not {type(error).__name__}")
    return Finish(ticket.id, ticket.fence, outcome, delay_ms, ticket.held, error, ticket.counted, result)


_OUTCOME_VALUES = frozenset(outcome.value for outcome in OUTCOMES)
