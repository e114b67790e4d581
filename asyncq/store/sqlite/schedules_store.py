"""The schedules' part of ``SqliteQueueStore`` (``asyncq.store.port.schedules``): each call one transaction of
``asyncq.store.sqlite.schedules`` in the connection's thread; a tick or run now that added jobs wakes this
process's idle pools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncq.core.schedules import Advanced, Evaluated, NewSchedule, Schedule, ScheduleEvent
from asyncq.store.sqlite import schedules as stored

if TYPE_CHECKING:
    from asyncq.store.sqlite.aio import AsyncFile


class SqliteSchedules:
    """Mixed into ``SqliteQueueStore``, whose file and write check it uses."""

    if TYPE_CHECKING:
        _file: AsyncFile

        async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...

    async def declare_schedules(
        self, rows: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int, actor: str
    ) -> list[ScheduleEvent]:
        written: list[ScheduleEvent] = await self._write(stored.declare, rows, scope, now_ms, actor)
        return written

    async def live_schedules(self) -> list[Evaluated]:
        found: list[Evaluated] = await self._file.run(stored.live)
        return found

    async def advance_schedule(self, name: str, revision: int, now_ms: int) -> Advanced | None:
        done: Advanced | None = await self._write(stored.advance, name, revision, now_ms)
        if done is not None and done.jobs:
            self._file.notify()
        return done

    async def set_schedule_paused(self, name: str, paused: bool, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        event: ScheduleEvent = await self._write(stored.set_paused, name, paused, now_ms, note, actor)
        return event

    async def run_schedule_now(self, name: str, now_ms: int, note: str, actor: str) -> ScheduleEvent:
        event: ScheduleEvent = await self._write(stored.run_now, name, now_ms, note, actor)
        self._file.notify()
        return event

    async def schedules(self) -> list[Schedule]:
        found: list[Schedule] = await self._file.run(stored.all_schedules)
        return found

    async def schedule_events(self, name: str | None, limit: int, ticks: bool) -> list[ScheduleEvent]:
        found: list[ScheduleEvent] = await self._file.run(stored.events, name, limit, ticks)
        return found
