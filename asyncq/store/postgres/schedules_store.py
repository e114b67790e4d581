"""The schedules' part of ``PostgresQueueStore`` (``asyncq.store.port.schedules``): each call one transaction of
``asyncq.store.postgres.schedules``' steps on a pooled connection; a tick or run now that added jobs notifies every
host (in its transaction) and this process's idle pools."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from asyncq.core.schedules import Advanced, Evaluated, NewSchedule, Schedule, ScheduleEvent
from asyncq.store.postgres import schedules as stored

if TYPE_CHECKING:
    from asyncq.store.postgres.wakeups import Wakeups

T = TypeVar("T")


class PostgresSchedules:
    """Mixed into ``PostgresQueueStore``, whose transactions and wake-ups it uses."""

    if TYPE_CHECKING:
        wakeups: Wakeups

        async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

        async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    async def declare_schedules(
        self, rows: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int, actor: str
    ) -> list[ScheduleEvent]:
        return await self._write(stored.declare, rows, scope, now_ms, actor)

    async def live_schedules(self) -> list[Evaluated]:
        return await self._read(stored.live)

    async def advance_schedule(self, name: str, revision: int, now_ms: int) -> Advanced | None:
        done = await self._write(stored.advance, name, revision, now_ms, self.wakeups.channel)
        if done is not None and done.jobs:
            self.wakeups.notify()
        return done

    async def set_schedule_paused(self, name: str, paused: bool, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        return await self._write(stored.set_paused, name, paused, now_ms, note, actor)

    async def run_schedule_now(self, name: str, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        event = await self._write(stored.run_now, name, now_ms, note, actor, self.wakeups.channel)
        self.wakeups.notify()
        return event

    async def schedules(self) -> list[Schedule]:
        return await self._read(stored.all_schedules)

    async def schedule_events(self, name: str | None, limit: int, ticks: bool) -> list[ScheduleEvent]:
        return await self._read(stored.events, name, limit, ticks)
