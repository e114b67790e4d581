"""``SqliteConsoleStore``: the console store's port (``asyncq.store.port.console``) on the queue store's own SQLite
connection: every call one transaction run whole in that connection's thread, writes after the process's other
writers (``asyncq.store.sqlite.aio``)."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncq.core.jobs import Job
from asyncq.core.operations import BULK_SCAN, REDRIVE, RESUME, AuditQuery, Operation, OperationEntry
from asyncq.core.samples import Figures, Sample, Totals, WorkerLook, WorkerSeen
from asyncq.core.search import MAX_IDS, DeadGroup, JobPage, Position, SearchPlan
from asyncq.core.stats import Stats
from asyncq.store.sqlite import operations, samples, search
from asyncq.store.sqlite.admin import snapshot
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import read_stats

if TYPE_CHECKING:
    from asyncq.store.sqlite.queue_store import SqliteQueueStore


class SqliteConsoleStore:
    """The console's reads and writes on one queue file (see ``asyncq.store.port.console`` for each rule)."""

    def __init__(self, store: SqliteQueueStore) -> None:
        self._store = store

    async def search(self, plan: SearchPlan, after: Position | None, page: int, scan: int) -> JobPage:
        found: JobPage = await self._store._file.run(search.search, plan, after, page, scan)
        return found

    async def select(self, plan: SearchPlan, now_ms: int) -> tuple[list[Job], bool]:
        find = functools.partial(search.search, body=False)
        page: JobPage = await self._store._file.run(find, plan, None, MAX_IDS, BULK_SCAN)
        return page.jobs, page.next is not None

    async def queue_states(self, queues: Sequence[str]) -> dict[str, int | None]:
        def read(con: sqlite3.Connection) -> dict[str, int | None]:
            with snapshot(con):
                return {queue: operations.queue_state(con, queue) for queue in queues}

        found: dict[str, int | None] = await self._store._file.run(read)
        return found

    async def operate(self, operation: Operation, now_ms: int) -> OperationEntry:
        entry: OperationEntry = await self._store._write(operations.operate, operation, now_ms)
        if operation.action in (REDRIVE, RESUME):
            self._store._file.notify()  # jobs ready again: this process's waiting workers look at once
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
