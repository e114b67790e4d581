"""``PostgresConsoleStore``: the console store's port (``asyncq.store.port.console``) on the queue store's own pool:
reads in one ``REPEATABLE READ`` read-only snapshot, writes in one transaction, transient failures as
``PostgresBusy`` (the queue store's ``_read`` and ``_write``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncq.core.dependencies import DependencyState, Ripple
from asyncq.core.operations import REDRIVE, RESUME, RUN_SCHEDULE, AuditQuery, Operation, OperationEntry, Selection
from asyncq.core.samples import Figures, Sample, Totals, WorkerLook, WorkerSeen
from asyncq.core.search import DeadGroup, JobPage, JobQuery, Position, SearchPlan
from asyncq.store.postgres import graph_reads, operations, samples, search
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.statements import NOTIFY

if TYPE_CHECKING:
    from asyncq.store.postgres.queue_store import PostgresQueueStore

#: The actions that make jobs ready (a cancel does when its graphs released some: ``Ripple``; those NOTIFY in their
#: transaction as every settle does).
WAKES = (REDRIVE, RESUME, RUN_SCHEDULE)


class PostgresConsoleStore:
    """The console's reads and writes on one PostgreSQL queue (see ``asyncq.store.port.console`` for each rule)."""

    def __init__(self, store: PostgresQueueStore) -> None:
        self._store = store

    async def search(self, plan: SearchPlan, after: Position | None, page: int, scan: int) -> JobPage:
        return await self._store._read(search.search, plan, after, page, scan)

    async def select(self, action: str, query: JobQuery, now_ms: int) -> Selection:
        return await self._store._read(operations.find_set, action, query)

    async def queue_states(self, queues: Sequence[str]) -> dict[str, int | None]:
        return await self._store._read(operations.queue_states, list(queues))

    async def operate(self, operation: Operation, now_ms: int) -> OperationEntry:
        wakes = operation.action in WAKES and operation.action != RUN_SCHEDULE  # a run now NOTIFYs by itself
        ripple = Ripple()

        async def step(conn: Connection, schema: str) -> OperationEntry:
            entry = await operations.operate(conn, schema, operation, now_ms, ripple)
            if wakes:  # jobs ready again: waiting workers on every host look
                await conn.execute(NOTIFY, self._store.wakeups.channel)
            return entry

        entry = await self._store._write(step)
        if operation.action in WAKES or ripple.released:
            self._store.wakeups.notify()
        return entry

    async def operations(self, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
        return await self._store._read(operations.find_entries, query)

    async def operations_by_seq(self, seqs: Sequence[int]) -> dict[int, OperationEntry]:
        return await self._store._read(operations.entries_by_seq, list(seqs))

    async def dead_groups(self, queue: str | None, scan: int) -> tuple[list[DeadGroup], int]:
        return await self._store._read(samples.dead_groups, queue, scan)

    async def dependants(self, job_id: str, limit: int) -> list[DependencyState]:
        return await self._store._read(graph_reads.dependants, job_id, limit)

    async def totals(self, now_ms: int) -> Totals:
        return await self._store._read(samples.totals, now_ms)

    async def read_figures(self, now_ms: int) -> Figures:
        return await self._store._read(samples.read_figures, now_ms)

    async def write_sample(self, figures: Figures, workers: Sequence[WorkerLook], every_ms: int, keep_ms: int) -> bool:
        return await self._store._write(samples.write_sample, figures, workers, every_ms, keep_ms)

    async def samples(self, since_ms: int) -> list[Sample]:
        return await self._store._read(samples.samples_since, since_ms)

    async def workers_seen(self) -> list[WorkerSeen]:
        return await self._store._read(samples.workers_seen)
