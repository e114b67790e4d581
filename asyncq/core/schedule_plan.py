"""What one evaluation of a schedule does, decided from values (no I/O here): which ticks are due since the stored
last tick, which run, which are skipped or missed and why, what the row becomes (``plan_step``); and what a
declaration changes (``plan_declarations``). Every driver writes these plans in one transaction, the row's update a
compare-and-set on its revision and last tick, so that one tick is one job whoever evaluates it
(``docs/schedules.md``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from asyncq.core.cron import Cron
from asyncq.core.schedules import (
    CHANGED,
    DECLARED,
    MAX_CATCH_UP,
    MAX_TICK_EVENTS,
    MISSED,
    MISSED_GRACE_MS,
    OVERLAP,
    PAUSED,
    QUEUE_PAUSED,
    RETIRED,
    Evaluated,
    NewSchedule,
    Schedule,
)


@functools.lru_cache(maxsize=256)
def cron_of(text: str) -> Cron:
    """A stored (checked) expression, parsed once per process."""
    return Cron.parse(text)


def fire_times(schedule: NewSchedule, after_ms: int) -> Iterator[int]:
    """The ticks of ``schedule`` after ``after_ms``, in order: a cron expression's fire times in its zone, or an
    interval's ``after + k·every``."""
    if schedule.cron is not None:
        return cron_of(schedule.cron).fire_times(after_ms, schedule.tz)
    assert schedule.every_ms is not None
    return itertools.count(after_ms + schedule.every_ms, schedule.every_ms)


def next_tick(schedule: NewSchedule, after_ms: int) -> int:
    """The first tick after ``after_ms``."""
    return next(fire_times(schedule, after_ms))


class Due(NamedTuple):
    """The ticks due in ``(after, now]``: ``newest``, at most as many as asked, in order; the older ones as
    ``older`` (the first ``MAX_TICK_EVENTS``, one by one) and ``rest`` (the first and last of the others and how
    many they are, or ``None``)."""

    newest: list[int]
    older: list[int]
    rest: tuple[int, int, int] | None

    @property
    def last(self) -> int | None:
        """The newest due tick, if any."""
        if self.newest:
            return self.newest[-1]
        return self.rest[1] if self.rest is not None else self.older[-1] if self.older else None


def due_ticks(schedule: NewSchedule, after_ms: int, now_ms: int, newest: int) -> Due:
    """The ticks due in ``(after_ms, now_ms]``, bounded whatever their number: a year of minutes is read as its
    oldest ticks, its newest, and a count of those between (``count_ticks``)."""
    limit = newest + MAX_TICK_EVENTS + 1
    head = list(itertools.islice(itertools.takewhile(lambda t: t <= now_ms, fire_times(schedule, after_ms)), limit))
    if len(head) < limit:  # every due tick listed
        cut = len(head) - newest
        older = head[:cut]
        if len(older) <= MAX_TICK_EVENTS:
            return Due(head[cut:], older, None)
        rest = older[MAX_TICK_EVENTS:]
        return Due(head[cut:], older[:MAX_TICK_EVENTS], (rest[0], rest[-1], len(rest)))
    tail = _newest_ticks(schedule, after_ms, now_ms, newest + 1)  # the newest, then the tick before them
    first, through = head[MAX_TICK_EVENTS], tail[newest]
    return Due(sorted(tail[:newest]), head[:MAX_TICK_EVENTS], (first, through, count_ticks(schedule, first, through)))


def count_ticks(schedule: NewSchedule, first_ms: int, through_ms: int) -> int:
    """How many ticks lie in ``[first_ms, through_ms]``."""
    if schedule.cron is not None:
        return cron_of(schedule.cron).count(first_ms, through_ms, schedule.tz)
    assert schedule.every_ms is not None
    return (through_ms - first_ms) // schedule.every_ms + 1


def _newest_ticks(schedule: NewSchedule, after_ms: int, now_ms: int, count: int) -> list[int]:
    """Up to ``count`` ticks at or before ``now_ms`` and after ``after_ms``, newest first."""
    if schedule.cron is not None:
        back = cron_of(schedule.cron).fire_times_back(now_ms, schedule.tz)
        return list(itertools.islice(itertools.takewhile(lambda t: t > after_ms, back), count))
    every = schedule.every_ms
    assert every is not None
    last = after_ms + (now_ms - after_ms) // every * every
    return [tick for tick in range(last, last - count * every, -every) if tick > after_ms]


class TickEvent(NamedTuple):
    """A tick that did not run: why (``core.schedules.TICK_KINDS``), when it was due, and for a range written as
    one event, its last tick and how many ticks it stands for."""

    kind: str
    tick_ms: int
    through_ms: int | None = None
    ticks: int = 1


@dataclass(frozen=True)
class StepPlan:
    """What an evaluation writes: the jobs for ``fire`` (ticks, in order), the ``events``, and the row's new last
    tick, next tick and queued tick; how many ticks it ``fired``, ``skipped`` and ``missed``. ``changes`` is
    ``False`` for an evaluation that writes nothing (nothing due, or a queued tick still waiting)."""

    fire: tuple[int, ...] = ()
    events: tuple[TickEvent, ...] = ()
    last_tick: int | None = None
    next_tick: int | None = None
    queued_tick: int | None = None
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    changes: bool = False


def _as_events(kind: str, due: Due) -> list[TickEvent]:
    """The older ticks of ``due`` as events of ``kind``: one a tick, and one for the range after them."""
    events = [TickEvent(kind, tick) for tick in due.older]
    if due.rest is not None:
        first, through, count = due.rest
        events.append(TickEvent(kind, first, through, count))
    return events


def plan_step(seen: Evaluated, now_ms: int) -> StepPlan:
    """One evaluation of a schedule at ``now_ms`` (a retired one: nothing). Due ticks are those after its base (the
    later of the last tick and the declaration) up to ``now_ms``. A paused schedule writes each as ``paused``; a
    running one applies ``missed`` to them, then ``overlap`` to each tick that would run, oldest first
    (``_overlap``)."""
    schedule = seen.schedule
    if schedule.retired:
        return StepPlan()
    definition = schedule.definition
    if schedule.paused:
        due = due_ticks(definition, schedule.base, now_ms, 0)
        return _finish(schedule, due, _as_events(PAUSED, due), [], schedule.queued_tick)
    due = due_ticks(definition, schedule.base, now_ms, MAX_CATCH_UP if definition.missed == "all" else 1)
    events = _as_events(MISSED, due)
    candidates = due.newest
    if definition.missed == "skip" and candidates and now_ms - candidates[-1] > MISSED_GRACE_MS:
        events += [TickEvent(MISSED, tick) for tick in candidates]
        candidates = []
    fire, queued, skips = _overlap(seen, candidates, now_ms)
    return _finish(schedule, due, events + skips, fire, queued)


def _overlap(seen: Evaluated, candidates: list[int], now_ms: int) -> tuple[list[int], int | None, list[TickEvent]]:
    """Which ticks run, which one is held (``queue_one``), which are skipped: a tick runs if the schedule's newest
    run is no longer active (or ``overlap="allow"``); a tick held earlier runs first once it is not."""
    definition = seen.schedule.definition
    fire: list[int] = []
    skips: list[TickEvent] = []
    active = seen.previous.active(now_ms)
    queued = seen.schedule.queued_tick
    if queued is not None and not active:
        fire.append(queued)
        queued, active = None, True
    for tick in candidates:
        if not active or definition.overlap == "allow":
            fire.append(tick)
            active = True
        elif definition.overlap == "queue_one" and queued is None:
            queued = tick
        else:  # the previous run waits in a paused queue: say so, rather than "overlap"
            waiting = not fire and seen.queue_paused and seen.previous.status == "pending"
            skips.append(TickEvent(QUEUE_PAUSED if waiting else OVERLAP, tick))
    return fire, queued, skips


def _finish(schedule: Schedule, due: Due, events: list[TickEvent], fire: list[int], queued: int | None) -> StepPlan:
    last = due.last
    if last is None and not fire and queued == schedule.queued_tick:
        return StepPlan()
    last_tick = schedule.last_tick if last is None else last
    base = schedule.declared_at if last_tick is None else max(last_tick, schedule.declared_at)
    missed = sum(event.ticks for event in events if event.kind == MISSED)
    return StepPlan(
        fire=tuple(fire),
        events=tuple(events),
        last_tick=last_tick,
        next_tick=next_tick(schedule.definition, base),
        queued_tick=queued,
        fired=len(fire),
        skipped=sum(event.ticks for event in events) - missed,
        missed=missed,
        changes=True,
    )


# -- declarations ---------------------------------------------------------------------------------------------


class Declared(NamedTuple):
    """One row a declaration writes: the definition (``None``: retire it), the event kind, and the row's new
    ``declared_at`` and ``next_tick`` (``None`` once retired)."""

    name: str
    definition: NewSchedule | None
    kind: str
    declared_at: int
    next_tick: int | None


@dataclass(frozen=True)
class DeclarePlan:
    """What a declaration writes: new rows (``added``) and changes to existing ones (``updated``, by the revision
    they were read at), each with its event."""

    added: list[Declared] = field(default_factory=list)
    updated: list[tuple[Declared, int]] = field(default_factory=list)

    @property
    def changed(self) -> list[Declared]:
        return [*self.added, *(row for row, _revision in self.updated)]


def plan_declarations(
    existing: Mapping[str, Schedule], declared: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int
) -> DeclarePlan:
    """Upsert ``declared`` over ``existing``: a new name is added (ticks after ``now_ms``); a retired one revived
    (ticks after ``now_ms``: none for its retired time); a changed definition replaces the old (a change of its
    cron, interval or zone counts the ticks afresh after ``now_ms``, any other change keeps its ticks); the same
    definition writes nothing. With a ``scope`` (queues), every live schedule of those queues not declared is
    retired (it never fires again; its row and events stay)."""
    plan = DeclarePlan()
    for definition in declared:
        found = existing.get(definition.name)
        if found is None:
            plan.added.append(Declared(definition.name, definition, DECLARED, now_ms, next_tick(definition, now_ms)))
        elif found.retired or found.definition.timing() != definition.timing():
            kind = DECLARED if found.retired else CHANGED
            after = max(now_ms, found.last_tick or now_ms)
            plan.updated.append((Declared(definition.name, definition, kind, now_ms, next_tick(definition, after)),
                                 found.revision))  # fmt: skip
        elif found.definition != definition:
            row = Declared(definition.name, definition, CHANGED, found.declared_at, found.next_tick)
            plan.updated.append((row, found.revision))
    if scope is not None:
        names = {definition.name for definition in declared}
        for found in existing.values():
            if found.name not in names and not found.retired and found.definition.queue in scope:
                plan.updated.append((Declared(found.name, None, RETIRED, found.declared_at, None), found.revision))
    return plan
