"""The schedules' part of the queue store's port (``QueueStore`` includes it): what ``Queue``'s schedule calls and a
pool's schedule keeper ask of a store.

What every store guarantees (``tests/conformance/test_schedules.py`` checks each):

- **One job per tick.** ``advance_schedule`` plans with ``core.schedule_plan.plan_step`` on the row it reads, and
  writes in one transaction: the row's update, a compare-and-set on the revision and the last tick it planned from,
  then the jobs of the ticks that run (ids ``core.schedules.schedule_job_id``: the schedule and the tick) and the
  events. Two evaluations of one tick, in any processes, on any clocks: one writes, the other changes nothing.
  A failure (a process killed) before the commit leaves neither the row's advance nor a job.
- **Ticks from the stored row.** Which ticks are due comes from the row's last tick (or its declaration), never
  from a process's memory.
- **Every move in one transaction with its event**: declarations (added, changed, revived, retired), pause, resume
  and run now; a move refused (``ValueError``) changes nothing.
- **Time from the caller**, as everywhere: ``now_ms`` is the caller's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from asyncq.core.schedules import Advanced, Evaluated, NewSchedule, Schedule, ScheduleEvent


class ScheduleStore(Protocol):
    """A store's schedules (see the module's docstring for what each call guarantees)."""

    async def declare_schedules(
        self, rows: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int, actor: str
    ) -> list[ScheduleEvent]:
        """Upsert ``rows`` by name and, with a ``scope`` (queues), retire every live schedule of those queues that
        ``rows`` does not name (``core.schedule_plan.plan_declarations``), in one transaction; the events written."""
        ...

    async def live_schedules(self) -> list[Evaluated]:
        """Every schedule not retired, each with its newest run's stored state and whether its queue is paused."""
        ...

    async def advance_schedule(self, name: str, revision: int, now_ms: int) -> Advanced | None:
        """Evaluate ``name`` at ``now_ms`` if its row is still at ``revision``, in one transaction (jobs, events, the
        row's compare-and-set); ``None`` if it changed first or nothing was due."""
        ...

    async def set_schedule_paused(self, name: str, paused: bool, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        """Pause or resume ``name`` with its event (a resume writes the ticks due while paused as ``paused``
        first); ``ValueError`` (nothing changes) if it is missing, retired, or in that state already."""
        ...

    async def run_schedule_now(self, name: str, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        """Enqueue a job of ``name`` now, its stored tick unmoved, recorded as its newest run; the ``run_now``
        event (its ``job_id``). ``ValueError`` if it is missing or retired."""
        ...

    async def schedules(self) -> list[Schedule]:
        """Every schedule (retired ones too), by name."""
        ...

    async def schedule_events(self, name: str | None, limit: int, ticks: bool) -> list[ScheduleEvent]:
        """The newest ``limit`` events, of ``name`` only if given, only ticks that did not run if ``ticks``, newest
        first."""
        ...
