"""The tick plan, from values (``asyncq.core.schedule_plan``): which ticks are due since the stored last tick, how
``missed`` and ``overlap`` decide each, how a long run of ticks is bounded and still counted exactly, and what a
declaration changes. The stores write these plans (``tests/conformance/test_schedules.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from asyncq.core.cron import Cron
from asyncq.core.schedule_plan import TickEvent, due_ticks, plan_declarations, plan_step
from asyncq.core.schedules import (
    MAX_CATCH_UP,
    MAX_TICK_EVENTS,
    Evaluated,
    NewSchedule,
    Previous,
    Schedule,
    ScheduleSpec,
    schedule_job_id,
)

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
S = 1000


def definition(**fields: Any) -> NewSchedule:
    options: dict[str, Any] = {"every": 10} | fields
    return ScheduleSpec("beat", {"n": 1}, **options).to_row()


def stored(new: NewSchedule, **state: Any) -> Schedule:
    values: dict[str, Any] = {"declared_at": T0, "revision": 1, "last_tick": None, "next_tick": None,
                              "queued_tick": None, "last_job": None, "paused_at": None, "paused_by": None,
                              "pause_note": None, "retired_at": None, "ticks_fired": 0, "ticks_skipped": 0,
                              "ticks_missed": 0}  # fmt: skip
    return Schedule(new, **(values | state))


def seen(
    schedule: Schedule, status: str | None = None, lease_until: int | None = None, paused: bool = False
) -> Evaluated:
    return Evaluated(schedule, Previous(status, lease_until), paused)


# -- due ticks ---------------------------------------------------------------------------------------------------


def test_the_due_ticks_of_an_interval_count_from_the_base() -> None:
    due = due_ticks(definition(), T0, T0 + 95 * S, 1)
    assert due.newest == [T0 + 90 * S]
    assert due.older == [T0 + n * 10 * S for n in range(1, 9)] and due.rest is None


def test_a_day_of_one_second_ticks_is_bounded_and_counted_exactly() -> None:
    new = definition(every=1)
    due = due_ticks(new, T0, T0 + 86_400 * S, MAX_CATCH_UP)
    assert due.newest == [T0 + n * S for n in range(86_301, 86_401)]
    assert due.older == [T0 + n * S for n in range(1, MAX_TICK_EVENTS + 1)]
    assert due.rest == (T0 + (MAX_TICK_EVENTS + 1) * S, T0 + 86_300 * S, 86_300 - MAX_TICK_EVENTS)


def test_a_week_of_minutes_in_berlin_is_bounded_and_counted_exactly() -> None:
    new = definition(every=None, cron="* * * * *", tz="Europe/Berlin")
    now = T0 + 7 * 86_400 * S
    due = due_ticks(new, T0, now, 1)
    assert due.rest is not None and len(due.older) == MAX_TICK_EVENTS
    assert len(due.newest) + len(due.older) + due.rest[2] == Cron.parse("* * * * *").count(T0 + 1, now, "Europe/Berlin")
    assert due.newest == [Cron.parse("* * * * *").next_after(now - 60 * S, "Europe/Berlin")]


# -- one evaluation ----------------------------------------------------------------------------------------------


def test_missed_latest_runs_the_newest_tick_and_writes_the_others_missed() -> None:
    plan = plan_step(seen(stored(definition())), T0 + 35 * S)
    assert plan.fire == (T0 + 30 * S,)
    assert plan.events == (TickEvent("missed", T0 + 10 * S), TickEvent("missed", T0 + 20 * S))
    assert (plan.last_tick, plan.next_tick, plan.fired, plan.skipped, plan.missed) == (
        T0 + 30 * S,
        T0 + 40 * S,
        1,
        0,
        2,
    )


def test_missed_skip_runs_the_newest_only_within_its_grace() -> None:
    late = plan_step(seen(stored(definition(every=120, missed="skip"))), T0 + 181 * S)
    assert late.fire == () and late.events == (TickEvent("missed", T0 + 120 * S),) and late.missed == 1
    on_time = plan_step(seen(stored(definition(every=120, missed="skip"))), T0 + 170 * S)
    assert on_time.fire == (T0 + 120 * S,)


def test_missed_all_runs_each_but_overlap_skip_lets_only_the_first_run() -> None:
    allowed = plan_step(seen(stored(definition(missed="all", overlap="allow"))), T0 + 35 * S)
    assert allowed.fire == (T0 + 10 * S, T0 + 20 * S, T0 + 30 * S) and allowed.events == ()
    skipping = plan_step(seen(stored(definition(missed="all"))), T0 + 35 * S)
    assert skipping.fire == (T0 + 10 * S,)
    assert skipping.events == (TickEvent("overlap", T0 + 20 * S), TickEvent("overlap", T0 + 30 * S))


def test_overlap_skip_checks_the_newest_run_pending_or_under_a_live_lease() -> None:
    schedule = stored(definition())
    now = T0 + 10 * S
    assert plan_step(seen(schedule, "pending"), now).events == (TickEvent("overlap", now),)
    assert plan_step(seen(schedule, "pending", paused=True), now).events == (TickEvent("queue_paused", now),)
    assert plan_step(seen(schedule, "leased", now + 1), now).fire == ()
    for previous in [("leased", now), ("done", None), ("dead", None), (None, None)]:  # expired, ended, removed
        assert plan_step(seen(schedule, *previous), now).fire == (now,), previous


def test_queue_one_holds_one_tick_until_the_run_ends_and_skips_more() -> None:
    schedule = stored(definition(overlap="queue_one"))
    held = plan_step(seen(schedule, "leased", T0 + 60 * S), T0 + 10 * S)
    assert (held.fire, held.queued_tick, held.events) == ((), T0 + 10 * S, ())
    schedule = replace(schedule, last_tick=T0 + 10 * S, queued_tick=T0 + 10 * S)
    more = plan_step(seen(schedule, "leased", T0 + 60 * S), T0 + 20 * S)
    assert (more.queued_tick, more.events) == (T0 + 10 * S, (TickEvent("overlap", T0 + 20 * S),))
    schedule = replace(schedule, last_tick=T0 + 20 * S)
    assert not plan_step(seen(schedule, "leased", T0 + 60 * S), T0 + 25 * S).changes  # still running: nothing
    freed = plan_step(seen(schedule, "done"), T0 + 25 * S)
    assert (freed.fire, freed.queued_tick, freed.last_tick) == ((T0 + 10 * S,), None, T0 + 20 * S)


def test_a_paused_schedule_writes_its_due_ticks_as_paused_and_a_retired_one_nothing() -> None:
    paused = plan_step(seen(stored(definition(), paused_at=T0)), T0 + 25 * S)
    assert paused.fire == () and [event.kind for event in paused.events] == ["paused", "paused"]
    assert (paused.skipped, paused.last_tick) == (2, T0 + 20 * S)
    assert not plan_step(seen(stored(definition(), retired_at=T0)), T0 + 25 * S).changes


def test_nothing_due_writes_nothing_and_ticks_count_from_the_later_of_last_tick_and_declaration() -> None:
    schedule = stored(definition(), last_tick=T0 - 5 * S, declared_at=T0)
    assert not plan_step(seen(schedule), T0 + 9 * S).changes
    assert plan_step(seen(schedule), T0 + 10 * S).fire == (T0 + 10 * S,)


def test_job_ids_name_the_schedule_and_the_tick_and_fit_an_id() -> None:
    assert schedule_job_id("beat", T0) == f"sch-beat-{T0}"
    long = schedule_job_id("x" * 64, T0)
    assert len(long) <= 64 and long.endswith(str(T0)) and long != schedule_job_id("y" * 64, T0)


# -- declarations ------------------------------------------------------------------------------------------------


def test_a_declaration_adds_changes_keeps_revives_and_retires_within_its_scope() -> None:
    now = T0 + 1000 * S
    beat = stored(definition(), last_tick=T0 + 990 * S, next_tick=T0 + 1000 * S)
    other = stored(definition()._replace(name="other", queue="mail"))
    old = stored(definition()._replace(name="old"), retired_at=T0)
    gone = stored(definition()._replace(name="gone"))
    existing = {s.name: s for s in (beat, other, old, gone)}
    declared = [definition(), definition()._replace(name="old"), definition()._replace(name="new")]
    plan = plan_declarations(existing, declared, ["default"], now)
    assert [(row.name, row.kind, row.next_tick) for row in plan.added] == [("new", "declared", now + 10 * S)]
    assert [(row.name, row.kind, row.definition is None, revision) for row, revision in plan.updated] == [
        ("old", "declared", False, 1),  # revived: ticks from now
        ("gone", "retired", True, 1),  # not declared, in scope; "other" is of another queue: kept
    ]
    retimed = plan_declarations(existing, [definition(every=60)], None, now)
    [(row, _revision)] = retimed.updated
    assert (row.kind, row.declared_at, row.next_tick) == ("changed", now, now + 60 * S)
    reprioritised = plan_declarations(existing, [definition(priority=5)], None, now)
    [(row, _revision)] = reprioritised.updated
    assert (row.kind, row.declared_at, row.next_tick) == ("changed", T0, beat.next_tick)  # its ticks kept
