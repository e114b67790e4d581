"""The Schedules screen (``docs/schedules.md``): each schedule with when it ticks, its state (running, paused by whom
and why, retired), its last tick, its next run, its counters and its newest run; the newest ticks that did not run
and why (or, for one schedule, every event of it, moves included); pause, resume and run now, one schedule or the
ticked ones, each previewed and audited like every console action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncq.core.schedules import Schedule, ScheduleEvent, timing_text
from asyncq.core.values import check_identifier
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

#: One schedule's events listed (of every kind: its moves too).
EVENTS_LISTED = 50
#: The newest ticks that did not run, of every schedule, listed under the table.
SKIPPED_LISTED = 20


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as the screen lists it."""

    schedule: Schedule
    when: str
    overdue_ms: int | None

    @property
    def state(self) -> str:
        if self.schedule.retired:
            return "retired"
        return "paused" if self.schedule.paused else "running"


async def page(ctx: Ctx) -> Response:
    found = await values(ctx)
    return ctx.render("schedules.html", 400 if found["error"] else 200, **found)


async def values(ctx: Ctx) -> dict[str, Any]:
    """Every schedule, and the events shown under them (of the schedule named by ``?name=``, or the newest ticks
    that did not run)."""
    queue = ctx.console.queue
    now = queue.now()
    name, error = ctx.request.arg("name"), None
    try:
        if name is not None:
            check_identifier(name, "name")
    except ValueError as refused:
        name, error = None, str(refused)
    rows = [_row(schedule, now) for schedule in await queue.schedules()]
    events: list[ScheduleEvent]
    if name is not None:
        events = await queue.schedule_events(name, limit=EVENTS_LISTED)
    else:
        events = await queue.schedule_events(limit=SKIPPED_LISTED, skipped_only=True)
    return {
        "rows": rows,
        "events": events,
        "name": name,
        "error": error,
        "live_count": sum(r.state != "retired" for r in rows),
    }


def _row(schedule: Schedule, now: int) -> ScheduleRow:
    due = schedule.next_tick
    overdue = now - due if due is not None and due < now and not schedule.paused else None
    return ScheduleRow(schedule, timing_text(schedule.definition), overdue)
