"""``SqliteConsoleStore``: the console store's port (``asyncq.store.port.console``) on the queue store's own SQLite
connection: every call one transaction run whole in that connection's thread, writes after the process's other
writers (``asyncq.store.sqlite.aio``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncq.core.dependencies import DependencyState, Ripple
from asyncq.core.operations import REDRIVE, RESUME, RUN_SCHEDULE, AuditQuery, Operation, OperationEntry, Selection
from asyncq.core.samples import Figures, Sample, Totals, WorkerLook, WorkerSeen
from asyncq.core.search import DeadGroup, JobPage, JobQuery, Position, SearchPlan
from asyncq.core.stats import Stats
from asyncq.store.sqlite import graph_reads, operations, samples, search
from asyncq.store.sqlite.admin import snapshot
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import read_stats

if TYPE_CHECKING:
    from asyncq.store.sqlite.queue_store import SqliteQueueStore

#: The actions that make jobs ready (a cancel does when its graphs released some: ``Ripple``).
WAKES = (REDRIVE, RESUME, RUN_SCHEDULE)


class SqliteConsoleStore:
    """The console's reads and writes on one queue file (see ``asyncq.store.port.console`` for each rule)."""

    def __init__(self, store: SqliteQueueStore) -> None:
        self._store = store

    async def search(self, plan: SearchPlan, after: Position | None, page: int, scan: int) -> JobPage:
        found: JobPage = await self._store._file.run(search.search, plan, after, page, scan)
        return found

    async def select(self, action: str, query: JobQuery, now_ms: int) -> Selection:
        def find(con: sqlite3.Connection) -> Selection:
            with snapshot(con):
                return operations.find_set(con, action, query)

        found: Selection = await self._store._file.run(find)
        return found

    async def queue_states(self, queues: Sequence[str]) -> dict[str, int | None]:
        def read(con: sqlite3.Connection) -> dict[str, int | None]:
            with snapshot(con):
                return {queue: operations.queue_state(con, queue) for queue in queues}

        found: dict[str, int | None] = await self._store._file.run(read)
        return found

    async def operate(self, operation: Operation, now_ms: int) -> OperationEntry:
        ripple = Ripple()
        entry: OperationEntry = await self._store._write(operations.operate, operation, now_ms, ripple)
        if operation.action in WAKES or ripple.released:
            self._store._file.notify()  # jobs ready (again): this process's waiting workers look at once
        return entry

    async def operations(self, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
        found: tuple[list[OperationEntry], int | None] = await self._store._file.run(operations.find_entries, query)
        return found

    async def operations_by_seq(self, seqs: Sequence[int]) -> dict[int, OperationEntry]:
        found: dict[int, OperationEntry] = await self._store._file.run(operations.entries_by_seq, list(seqs))
        return found

    async def dead_groups(self, queue: str | None, scan: int) -> tuple[list[DeadGroup], int]:
        found: tuple[list[DeadGroup], int] = await self._store._file.run(samples.dead_groups, queue, scan)
        return found

    async def dependants(self, job_id: str, limit: int) -> list[DependencyState]:
        found: list[DependencyState] = await self._store._file.run(graph_reads.dependants, job_id, limit)
        return found

    async def totals(self, now_ms: int) -> Totals:
        stats: Stats = await self._store._file.run(read_stats, PRODUCT, now_ms)  # the kept counts: no scan
        return Totals.of(stats)

    async def read_figures(self, now_ms: int) -> Figures:
        found: Figures = await self._store._file.run(samples.read_figures, now_ms)
        return found

    async def write_sample(self, figures: Figures, workers: Sequence[WorkerLook], every_ms: int, keep_ms: int) -> bool:
        written: bool = await self._store._write(samples.write_sample, figures, workers, every_ms, keep_ms)
        return written

    async def samples(self, since_ms: int) -> list[Sample]:
        found: list[Sample] = await self._store._file.run(samples.samples_since, since_ms)
        return found

    async def workers_seen(self) -> list[WorkerSeen]:
        found: list[WorkerSeen] = await self._store._file.run(samples.workers_seen)
        return found
