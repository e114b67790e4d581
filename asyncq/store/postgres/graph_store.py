"""The PostgreSQL queue store's calls for groups and for what jobs wait for (``asyncq.store.port.graphs``): a mixin
of ``PostgresQueueStore``, each call one transaction on a pooled connection; the app's transaction's seal beside it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from asyncq.core.dependencies import Ripple, WaitsFor
from asyncq.core.groups import Group
from asyncq.core.jobs import Job, NewJob
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.postgres import graph_reads, graphs, transitions
from asyncq.store.postgres.connection import Connection

if TYPE_CHECKING:
    from asyncq.store.postgres.wakeups import Wakeups

T = TypeVar("T")


async def seal_in_transaction(
    conn: Connection, schema: str, name: str, callback: NewJob | None, now_ms: int, ripple: Ripple
) -> Group:
    """Seal ``name`` inside the caller's transaction (``graphs.seal``) and read the group back."""
    insert = partial(transitions.enqueue_rows, conn, schema)
    await graphs.seal(conn, schema, name, callback, now_ms, insert, ripple)
    found = await graph_reads.group(conn, schema, name)
    assert found is not None
    return found


class PostgresGraphCalls:
    """The graph calls of ``PostgresQueueStore`` (see ``asyncq.store.port.graphs`` for each one's rule)."""

    wakeups: Wakeups

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

        async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        ripple = Ripple()
        found = await self._write(seal_in_transaction, name, callback, now_ms, ripple)
        if ripple.released:
            self.wakeups.notify()
        return found

    async def group(self, name: str) -> Group | None:
        return await self._read(graph_reads.group, name)

    async def groups(self, which: GroupFilter) -> list[Group]:
        return await self._read(graph_reads.groups, which)

    async def open_groups(self) -> int:
        return await self._read(graph_reads.open_groups)

    async def group_members(self, name: str, status: str | None, after: int, limit: int) -> list[Job]:
        return await self._read(graph_reads.group_members, name, status, after, limit)

    async def waits_for(self, job_ids: Sequence[str]) -> dict[str, WaitsFor]:
        return await self._read(graph_reads.waits_for, job_ids)
