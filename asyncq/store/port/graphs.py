"""The store port's dependencies and groups (``docs/dependencies.md``): what a queue store adds to its enqueue and
its transitions, and the calls that seal and read groups and read what a job waits for.

What every store guarantees besides ``QueueStore``'s rules (the conformance suite checks each on every driver):

- **A graph commits whole.** A batch whose jobs name dependencies (``NewJob.after``: jobs of the batch or stored
  ones, resolved to the job that stands for each) is refused with ``ValueError`` before any row is written if a
  dependency is unknown or a group named is sealed; its edges, places and counts commit with its rows.
- **Released in the finishing transaction.** The transaction that ends a job (a finish, the group commit's
  included; the sweep; a cancel) also settles each job waiting for it and its group, as ``core.dependencies``
  and ``core.groups`` decide: a dependant whose last edge is met goes pending in that transaction, and the
  transaction that ends the last member of a sealed group releases its callback, once.
- **Only graphs pay.** A job in no graph (``links`` NULL) ends with the statements it always had.
- **Retention keeps what a graph needs**: a dependency of a job that has not ended, a member of a group whose
  callback has not ended, a callback whose group is not complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from asyncq.core.dependencies import WaitsFor
from asyncq.core.groups import Group
from asyncq.core.jobs import Job, NewJob


@dataclass(frozen=True)
class GroupFilter:
    """Which groups ``groups`` lists: by name after ``after``, only those not complete if ``open_only``."""

    open_only: bool = False
    after: str = ""
    limit: int = 100


class GraphTransaction(Protocol):
    """What an open transaction of a store adds for groups."""

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        """``QueueStore.seal_group`` inside this transaction."""
        ...


class GraphStore(Protocol):
    """The calls of a queue store for groups and for what jobs wait for; each one transaction."""

    async def seal_group(self, name: str, callback: NewJob | None, now_ms: int) -> Group:
        """Seal group ``name`` (created if no member joined it yet): no member joins after. ``callback`` (its id
        ``core.groups.group_callback_id(name)``) is stored waiting for the group and released, its body carrying the
        outcome, by the transaction that completes it: this one, if every member has ended already. A group sealed
        before is returned as it is (nothing changes); ``Conflict`` if the callback's id is taken by another job."""
        ...

    async def group(self, name: str) -> Group | None:
        """One group as stored, or ``None``."""
        ...

    async def groups(self, which: GroupFilter) -> list[Group]:
        """Groups by name, at most ``which.limit``."""
        ...

    async def open_groups(self) -> int:
        """How many groups are not complete yet (sealed or not)."""
        ...

    async def group_members(self, name: str, status: str | None, after: int, limit: int) -> list[Job]:
        """The members of group ``name`` (in ``status`` if named) past ``seq = after``, in ``seq`` order, without
        their bodies."""
        ...

    async def waits_for(self, job_ids: Sequence[str]) -> dict[str, WaitsFor]:
        """For each of ``job_ids`` that exists: its dependencies as their edges stand, and the group it is the
        callback of."""
        ...
