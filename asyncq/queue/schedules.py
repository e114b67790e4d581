"""The schedule calls of a ``Queue``: declare schedules (``@app.periodic`` does at a worker's start), evaluate them
(a pool's schedule keeper does, ``asyncq.worker.schedules``), an operator's pause, resume and run now (each with an
event), and the listings (``docs/schedules.md``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from asyncq.core.jobs import MAX_BATCH
from asyncq.core.schedule_plan import plan_step
from asyncq.core.schedules import Advanced, Schedule, ScheduleEvent, ScheduleRun, ScheduleSpec
from asyncq.core.values import check_flag, check_identifier, check_int, check_note
from asyncq.errors import StoreBusy
from asyncq.queue.operators import actor_of
from asyncq.store.facade import StoreFacade
from asyncq.store.port.queue import QueueStore

log = logging.getLogger("asyncq.queue")


class ScheduleCalls(StoreFacade[QueueStore]):
    """Schedules as stored state (``Queue`` has these calls)."""

    max_body_bytes: int

    async def declare_schedules(
        self, schedules: Iterable[ScheduleSpec], *, scope: Iterable[str] | None = None, by: str | None = None
    ) -> list[ScheduleEvent]:
        """Upsert ``schedules`` by name, in one transaction: a new one counts its ticks from now; a changed cron,
        interval or zone counts afresh from now (any other change keeps its ticks); a retired one is revived. With a
        ``scope`` (queue names), every schedule of those queues that ``schedules`` does not name is retired: it never
        fires again, its row and events stay. The events written (``declared``, ``changed``, ``retired``)."""
        specs = list(schedules)
        wrong = [type(spec).__name__ for spec in specs if type(spec) is not ScheduleSpec]
        if wrong:
            raise TypeError(f"declare_schedules takes ScheduleSpec values, not {wrong[0]}")
        rows = [spec.to_row(self.max_body_bytes) for spec in specs]
        names = [row.name for row in rows]
        if len(set(names)) != len(names):
            raise ValueError(f"a schedule is named twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        queues = None if scope is None else sorted({check_identifier(name, "scope") for name in _names(scope)})
        events = await self.store.declare_schedules(rows, queues, self.now(), actor_of(by))
        for event in events:
            log.info("schedule %s %s (%s)", event.schedule, event.kind, event.note)
        if events:
            self._schedules_changed()
        return events

    async def run_schedules(self) -> ScheduleRun:
        """Evaluate every live schedule at ``now``: each one with a due tick (or a held tick free to run) in a
        transaction of its own, whose compare-and-set makes it one job per tick whoever else evaluates it. What
        the pass did. ``StoreBusy`` propagates (the caller tries again); a schedule that fails otherwise is logged
        and counted (``failed``) while the others go on."""
        now = self.now()
        jobs: list[str] = []
        skipped = missed = advanced = lost = failed = 0
        next_due: list[int] = []
        waiting = False
        for seen in await self.store.live_schedules():
            schedule, done = seen.schedule, None
            if plan_step(seen, now).changes:
                try:
                    done = await self.store.advance_schedule(schedule.name, schedule.revision, now)
                except StoreBusy:
                    raise
                except Exception as error:  # one schedule's failure must not stop the others' ticks
                    failed += 1
                    log.error("schedule %s: evaluation failed: %r", schedule.name, error, exc_info=error)
                else:
                    advanced, lost = advanced + (done is not None), lost + (done is None)
            if done is not None:
                jobs += done.jobs
                skipped, missed = skipped + done.skipped, missed + done.missed
            next_tick = _next(schedule, done)
            if next_tick is not None:
                next_due.append(next_tick)
            waiting = waiting or schedule.queued_tick is not None
        return ScheduleRun(tuple(jobs), skipped, missed, advanced, lost, failed, min(next_due, default=None), waiting)

    async def pause_schedule(self, name: str, *, note: str, by: str | None = None) -> ScheduleEvent:
        """Stop ``name``'s ticks from running, in every process (stored, until ``resume_schedule``): each tick that
        comes due while paused is written as a ``paused`` event. Its event (who, why). ``ValueError`` if there is no
        such schedule, it is retired, or already paused."""
        return await self._set_schedule_paused(name, True, note, by)

    async def resume_schedule(self, name: str, *, note: str, by: str | None = None) -> ScheduleEvent:
        """Let ``name``'s ticks run again from its next tick (the ticks due while paused are written as ``paused``
        first, none of them runs); its event. ``ValueError`` if it is not paused."""
        return await self._set_schedule_paused(name, False, note, by)

    async def _set_schedule_paused(self, name: str, paused: bool, note: str, by: str | None) -> ScheduleEvent:
        check_identifier(name, "name")
        check_note(note)
        actor = actor_of(by)
        event = await self.store.set_schedule_paused(name, paused, self.now(), note, actor)
        log.info("schedule %s %s by %s: %s", name, "paused" if paused else "resumed", actor, note)
        self._schedules_changed()
        return event

    async def run_schedule_now(self, name: str, *, note: str, by: str | None = None) -> ScheduleEvent:
        """Enqueue a job of ``name`` now, whatever its ticks and overlap say, without moving its stored tick; the
        job counts as its newest run (the next tick's overlap check sees it). Its event (``job_id``)."""
        check_identifier(name, "name")
        check_note(note)
        event = await self.store.run_schedule_now(name, self.now(), note, actor_of(by))
        log.info("schedule %s run now as job %s by %s: %s", name, event.job_id, event.actor, note)
        self._schedules_changed()
        return event

    async def schedules(self) -> list[Schedule]:
        """Every schedule, retired ones too, by name: its definition, last and next tick, pause, counters."""
        return await self.store.schedules()

    async def schedule_events(
        self, name: str | None = None, *, limit: int = 100, skipped_only: bool = False
    ) -> list[ScheduleEvent]:
        """The newest events (of ``name`` only, if given; with ``skipped_only``, the ticks that did not run only),
        newest first."""
        if name is not None:
            check_identifier(name, "name")
        checked = check_int(limit, "limit", 1, MAX_BATCH)
        return await self.store.schedule_events(name, checked, check_flag(skipped_only, "skipped_only"))

    def schedule_changed(self) -> asyncio.Event:
        """An event set when this process next declares, pauses, resumes or runs a schedule now. Take it before
        reading the schedules, then wait on it: a change made in between is not missed."""
        event: asyncio.Event | None = self.__dict__.get("_schedule_event")
        if event is None:
            event = self.__dict__["_schedule_event"] = asyncio.Event()
        return event

    def _schedules_changed(self) -> None:
        changed = self.schedule_changed()
        self.__dict__["_schedule_event"] = asyncio.Event()
        changed.set()


def _names(scope: Iterable[str]) -> list[str]:
    if isinstance(scope, str):
        raise TypeError("scope must be queue names (a list), not one str")
    return list(scope)


def _next(schedule: Schedule, done: Advanced | None) -> int | None:
    return schedule.next_tick if done is None else done.next_tick
