"""The graph calls on a ``Queue``: seal a group, read groups and their members, and what jobs wait for
(``docs/dependencies.md``). Dependencies themselves are enqueued with ``after=[…]`` (``Queue.enqueue``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from operator import itemgetter

from asyncq.core.dependencies import WaitsFor, check_batch
from asyncq.core.groups import Group, check_callback_body, check_group_name, group_callback_id
from asyncq.core.jobs import MAX_BATCH, MAX_BODY_BYTES, Job, JobSpec, NewJob
from asyncq.core.lifecycle import STATUSES
from asyncq.core.values import check_choice, check_flag, check_identifier, check_int
from asyncq.store.facade import StoreFacade
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.port.queue import QueueStore

log = logging.getLogger("asyncq.queue")


def callback_row(group: str, callback: object, now_ms: int, max_body_bytes: int = MAX_BODY_BYTES) -> NewJob | None:
    """A group's callback as the store inserts it, checked (``ValueError`` before any statement): a ``JobSpec`` whose
    id is ``group_callback_id(group)``, whose body is a JSON object, with no unique key, dependencies or group."""
    check_group_name(group)
    if callback is None:
        return None
    if type(callback) is not JobSpec:
        raise TypeError(f"callback must be a JobSpec, not {type(callback).__name__}")
    if callback.id != group_callback_id(group):
        raise ValueError(
            f"group {group!r}'s callback must have the id {group_callback_id(group)!r}, not {callback.id!r}"
        )
    check_callback_body(callback.body)
    if callback.unique_key is not None or callback.after or callback.group is not None:
        raise ValueError("a group's callback takes no unique_key, after or group")
    return callback.to_row(now_ms, max_body_bytes)


_LINKED = itemgetter(NewJob._fields.index("linked"))


def check_graph_batch(rows: Sequence[NewJob]) -> None:
    """A batch with dependencies or a group: each id once, no cycle (``core.dependencies.check_batch``)."""
    if any(map(_LINKED, rows)):  # C-speed for a batch in no graph (an enqueue's hot path)
        check_batch([(row.id, row.after) for row in rows])


class GraphCalls(StoreFacade[QueueStore]):
    """Groups and what jobs wait for (``Queue`` has them)."""

    max_body_bytes: int

    async def seal_group(self, group: str, *, callback: JobSpec | None = None) -> Group:
        """Seal ``group``: no member joins it after; once every member has ended (done or dead), ``callback`` (a
        ``JobSpec`` with the id ``group_callback_id(group)``, a JSON object as its body) runs once, the group's outcome
        under ``group`` in its body. Sealing a sealed group changes nothing. The group as stored after."""
        row = callback_row(group, callback, self.now(), self.max_body_bytes)
        found = await self.store.seal_group(group, row, self.now())
        log.info("group %s sealed (%d members, %d ended)", group, found.members, found.done + found.dead)
        return found

    async def group(self, group: str) -> Group | None:
        """One group as stored (its counters, sealed, completed, its callback), or ``None``."""
        return await self.store.group(check_group_name(group))

    async def groups(self, *, open_only: bool = False, after: str = "", limit: int = 100) -> list[Group]:
        """Groups by name after ``after`` (only those not complete yet with ``open_only``), at most ``limit``."""
        if after:
            check_group_name(after, "after")
        which = GroupFilter(check_flag(open_only, "open_only"), after, check_int(limit, "limit", 1, MAX_BATCH + 1))
        return await self.store.groups(which)

    async def open_groups(self) -> int:
        """How many groups are not complete yet."""
        return await self.store.open_groups()

    async def group_members(
        self, group: str, *, status: str | None = None, after: int = 0, limit: int = 100
    ) -> list[Job]:
        """The members of ``group`` (in ``status`` if named: ``done`` and ``dead`` are its outcomes), oldest first
        past ``seq = after``, at most ``limit``, without their bodies."""
        check_group_name(group)
        if status is not None:
            check_choice(status, "status", STATUSES)
        check_int(after, "after", 0, 2**63 - 1)
        return await self.store.group_members(group, status, after, check_int(limit, "limit", 1, MAX_BATCH + 1))

    async def waits_for(self, job_id: str) -> WaitsFor | None:
        """What ``job_id`` waits for (its dependencies as their edges stand, the group it is the callback of), or
        ``None`` if there is no such job."""
        return (await self.waiting_for([job_id])).get(job_id)

    async def waiting_for(self, job_ids: Iterable[str]) -> dict[str, WaitsFor]:
        """``waits_for`` of many jobs in one read (those that exist)."""
        ids = [check_identifier(job_id, "job_id") for job_id in job_ids]
        if len(ids) > MAX_BATCH + 1:
            raise ValueError(f"waiting_for reads at most {MAX_BATCH + 1} jobs at once")
        return await self.store.waits_for(ids) if ids else {}
