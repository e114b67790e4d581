"""``Queue``: the async facade over a queue store. It checks every argument, reads the injected clock, and hands
the store (``asyncq.store.port.QueueStore``) only checked values and ``now``.

On PostgreSQL every call is one transaction on a connection of the store's pool. On SQLite all writes of one
process go through one connection, one short ``BEGIN IMMEDIATE`` transaction at a time. Serialising writers
inside the process is deliberate: several connections contending for SQLite's write lock only sleep in its busy
handler (1, 2, 5 … 100 ms) while the holder re-takes the lock (docs/benchmarks.md, "How the design was measured").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.dependencies import Dependency
from asyncq.core.groups import Group
from asyncq.core.jobs import (
    DEFAULT_QUEUE,
    MAX_BODY_BYTES,
    Enqueued,
    EnqueueOptions,
    JobSpec,
    OnConflict,
    OnDependencyDeadName,
)
from asyncq.core.jsontext import JSONInput
from asyncq.core.limits import MAX_BUSY_TIMEOUT_SECONDS
from asyncq.core.values import (
    Duration,
    check_duration,
    check_flag,
    check_int,
)
from asyncq.errors import StoreError, UniqueConflict
from asyncq.queue.graphs import GraphCalls, callback_row, check_graph_batch
from asyncq.queue.operators import OperatorCalls
from asyncq.queue.reads import ReadCalls
from asyncq.queue.retention import RetentionCalls
from asyncq.queue.schedules import ScheduleCalls
from asyncq.queue.working import WorkerCalls
from asyncq.store.opening import inspect_queue_store, open_queue_store
from asyncq.store.port.queue import QueueStore, StoreState, StoreTransaction

log = logging.getLogger("asyncq.queue")


class QueueOptions(TypedDict, total=False):
    """``Queue.open``'s options after the path, by keyword (``asyncq.open`` takes the same)."""

    durability: str | None
    clock: Clock
    busy_timeout: float
    max_body_bytes: int
    read_only: bool


@dataclass
class EnqueueCounts:
    """What enqueues through one ``Queue`` answered since it opened (``Queue.enqueue_counts``; the metrics'
    ``EnqueueCollector`` exports them): jobs ``added``; ``existing``, the same id and body there already;
    ``unique_held``, not added because an active job of the queue held the unique key (answered with its id); and
    ``unique_refused``, enqueues that raised ``UniqueConflict`` (``on_conflict="raise"``). In a transaction that
    rolls back afterwards they were answered all the same."""

    added: int = 0
    existing: int = 0
    unique_held: int = 0
    unique_refused: int = 0

    def count(self, answers: Sequence[Enqueued]) -> None:
        """Count one batch's answers (``True``, ``False``, a holder's id)."""
        added, existing = answers.count(True), answers.count(False)  # no holder's id equals a bool
        self.added += added
        self.existing += existing
        self.unique_held += len(answers) - added - existing


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

    async def enqueue(self, job_id: str, body: JSONInput, **options: Unpack[EnqueueOptions]) -> Enqueued:
        """Enqueue inside this transaction (see ``Queue.enqueue``)."""
        row = JobSpec(job_id, body, **options).to_row(self._queue.now(), self._queue.max_body_bytes)
        try:
            answers = await self._inner.enqueue_rows([row])
        except UniqueConflict:
            self._queue.enqueue_counts.unique_refused += 1
            raise
        self._queue.enqueue_counts.count(answers)
        return answers[0]

    async def seal_group(self, group: str, *, callback: JobSpec | None = None) -> Group:
        """Seal ``group`` inside this transaction (see ``Queue.seal_group``): its members enqueued in this
        transaction and the seal commit together."""
        row = callback_row(group, callback, self._queue.now(), self._queue.max_body_bytes)
        return await self._inner.seal_group(group, row, self._queue.now())


class Queue(WorkerCalls, OperatorCalls, RetentionCalls, ReadCalls, ScheduleCalls, GraphCalls):
    """A durable job queue. Open with ``await Queue.open(path)`` for a SQLite file, or
    ``await Queue.open("postgresql://…")`` for PostgreSQL (``async with`` closes it)."""

    def __init__(self, store: QueueStore, clock: Clock = wall_clock_ms, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(store, clock)
        self.max_body_bytes = check_int(max_body_bytes, "max_body_bytes", 1, MAX_BODY_BYTES)
        self._ended = asyncio.Event()  # set (and replaced) when a finish in this process ends a job
        self._cancels = asyncio.Event()  # set (and replaced) when a cancel in this process stores a request
        #: What this queue's enqueues answered since it opened (unique keys held or refused among them).
        self.enqueue_counts = EnqueueCounts()

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
        check_flag(read_only, "read_only")
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
        unique_key: str | None = None,
        on_conflict: OnConflict = "return",
        after: Sequence[str | Dependency] = (),
        on_dependency_dead: OnDependencyDeadName = "dead",
        group: str | None = None,
        limit_key: str | None = None,
        connection: Any = None,
    ) -> Enqueued:
        """Add a job; ``True`` if added, ``False`` if the same id and body exist already, ``Conflict`` for another
        body. ``ttl`` (default a day) and ``delay`` are seconds or a ``timedelta``; ``priority`` (-100 … 100) orders
        the queue, higher first (``docs/flow-control.md``).

        ``unique_key``: while an active (pending or leased) job of ``queue`` holds this key, nothing is inserted and
        the answer is that job's id (a ``str``), or ``UniqueConflict`` with ``on_conflict="raise"``.

        ``after``: the ids of jobs (stored, or of the same batch) it waits for (``Dependency(id, on_dead=…)`` for an
        edge of its own policy); it is stored ``waiting`` and goes pending in the transaction that ends the last of
        them done; ``on_dependency_dead`` (``dead``, ``run``, ``wait``) says what a dependency that ends dead does.
        ``group``: the group it joins (``seal_group``). ``docs/dependencies.md``.

        ``limit_key`` (a tenant, an account): the jobs of ``queue`` a per-key concurrency limit bounds together
        (``set_limits(queue, per_key_concurrency=…)``; docs/flow-control.md, "Limits").

        ``connection``: on PostgreSQL, the app's own asyncpg connection with its transaction open (``async with
        conn.transaction(): … await queue.enqueue(…, connection=conn)``): the job commits or rolls back with the
        app's rows. On SQLite, use ``transaction()`` (or ``enqueue_sync`` on the app's ``sqlite3`` connection)."""
        spec = JobSpec(
            job_id,
            body,
            queue,
            max_attempts,
            ttl=ttl,
            delay=delay,
            priority=priority,
            unique_key=unique_key,
            on_conflict=on_conflict,
            after=after,
            on_dependency_dead=on_dependency_dead,
            group=group,
            limit_key=limit_key,
        )
        return (await self.enqueue_many([spec], connection=connection))[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec], *, connection: Any = None) -> list[Enqueued]:
        """Add several jobs in one transaction: all or none (in the app's, with ``connection``: see ``enqueue``).
        Two jobs of the batch with one unique key: the first is inserted, the second answers with its id."""
        now = self.now()
        rows = [_spec(job).to_row(now, self.max_body_bytes) for job in jobs]
        check_graph_batch(rows)
        try:
            added = await self.store.enqueue(rows, connection=connection)
        except UniqueConflict:
            self.enqueue_counts.unique_refused += 1
            raise
        self.enqueue_counts.count(added)
        if log.isEnabledFor(logging.DEBUG):
            for row, new in zip(rows, added, strict=True):
                if isinstance(new, str):
                    log.debug("job %s not enqueued: active job %s holds its unique key", row.id, new)
                else:
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


def _spec(job: object) -> JobSpec:
    if type(job) is not JobSpec:
        raise TypeError(f"enqueue_many takes JobSpec values, not {type(job).__name__}")
    return job
