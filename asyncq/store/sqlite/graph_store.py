"""The SQLite queue store's calls for groups and for what jobs wait for (``asyncq.store.port.graphs``): a mixin of
``SqliteQueueStore``, each call one transaction in the connection's thread; the app's transaction's seal beside it."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from asyncq.core.dependencies import Ripple, WaitsFor
from asyncq.core.groups import Group
from asyncq.core.jobs import Job, NewJob
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.sqlite import engine, graph_reads, graphs
from asyncq.store.sqlite.aio import AppTransaction, AsyncFile
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.schema import PRODUCT


def seal_in_transaction(
    con: sqlite3.Connection, name: str, callback: NewJob | None, now_ms: int, ripple: Ripple
) -> Group:
    """Seal ``name`` inside the caller's transaction (``graphs.seal``) and read the group back."""
    graphs.seal(con, name, callback, now_ms, partial(engine.enqueue_rows_in_transaction, con, PRODUCT), ripple)
    found = graph_reads.group(con, name)
    assert found is not None
    return found


def _seal(con: sqlite3.Connection, name: str, callback: NewJob | None, now_ms: int, ripple: Ripple) -> Group:
    with write_transaction(con):
        return seal_in_transaction(con, name, callback, now_ms, ripple)


class GraphTransactionCalls(AppTransaction):
    """An app's transaction's seal (``SqliteTransaction`` has it)."""

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        ripple = Ripple()
        found: Group = await self._run_step(seal_in_transaction, name, callback, now_ms, ripple)
        self.added += ripple.released  # a callback released now wakes this process's workers after the commit
        return found


class SqliteGraphCalls:
    """The graph calls of ``SqliteQueueStore`` (see ``asyncq.store.port.graphs`` for each one's rule)."""

    _file: AsyncFile

    if TYPE_CHECKING:

        async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        ripple = Ripple()
        found: Group = await self._write(_seal, name, callback, now_ms, ripple)
        if ripple.released:
            self._file.notify()
        return found

    async def group(self, name: str) -> Group | None:
        found: Group | None = await self._file.run(graph_reads.group, name)
        return found

    async def groups(self, which: GroupFilter) -> list[Group]:
        found: list[Group] = await self._file.run(graph_reads.groups, which)
        return found

    async def open_groups(self) -> int:
        found: int = await self._file.run(graph_reads.open_groups)
        return found

    async def group_members(self, name: str, status: str | None, after: int, limit: int) -> list[Job]:
        found: list[Job] = await self._file.run(graph_reads.group_members, name, status, after, limit)
        return found

    async def waits_for(self, job_ids: Sequence[str]) -> dict[str, WaitsFor]:
        found: dict[str, WaitsFor] = await self._file.run(graph_reads.waits_for, job_ids)
        return found
