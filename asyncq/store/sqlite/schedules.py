"""Schedules on SQLite (``asyncq_schedules``, ``asyncq_schedule_events``): each write one ``BEGIN IMMEDIATE``
transaction on a ``sqlite3`` connection, deciding by ``core.schedule_plan``. A tick's jobs are inserted in the
transaction whose update of the schedule's row is a compare-and-set on the revision and the last tick it was
planned from, so a tick is one job whichever process evaluates it, and a process killed before the commit leaves
neither (``docs/schedules.md``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from asyncq.core.schedule_plan import Declared, StepPlan, plan_declarations, plan_step
from asyncq.core.schedules import (
    COLUMNS,
    EVENT_COLUMNS,
    KEPT_TICK_EVENTS,
    PAUSE,
    RESUME,
    RUN_NOW,
    Advanced,
    Evaluated,
    NewSchedule,
    Previous,
    Schedule,
    ScheduleEvent,
    move_refused,
    run_now_job_id,
    schedule_job,
    schedule_job_id,
    timing_text,
)
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.engine import enqueue_rows_in_transaction
from asyncq.store.sqlite.schema import PRODUCT

#: Tests only: called inside a tick's transaction once its rows are written, before the commit (a test's child
#: process blocks here and is killed).
FAULT: Callable[[str], object] | None = None

# Version 12: schedules as stored state (docs/schedules.md). One row per schedule: its definition (a cron expression
# in an IANA zone, or an interval; the policies; the job a tick enqueues), the last tick decided and the next one, a
# tick held by ``queue_one``, the newest run's job id (the overlap check reads that job's row), pause and retirement,
# and its tick counters; ``revision`` goes up with every write, the compare-and-set of every tick. The events: each
# skipped or missed tick (or a range of them as one row) and every move on a schedule, newest kept.
SCHEDULE_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_schedules (name TEXT PRIMARY KEY, cron TEXT, every_ms INTEGER,
  tz TEXT NOT NULL, overlap TEXT NOT NULL CHECK (overlap IN ('skip', 'queue_one', 'allow')),
  missed TEXT NOT NULL CHECK (missed IN ('latest', 'skip', 'all')), task TEXT NOT NULL, queue TEXT NOT NULL,
  body TEXT NOT NULL, priority INTEGER NOT NULL, max_attempts INTEGER NOT NULL, ttl_ms INTEGER NOT NULL,
  declared_at INTEGER NOT NULL, revision INTEGER NOT NULL, last_tick INTEGER, next_tick INTEGER,
  queued_tick INTEGER, last_job TEXT, paused_at INTEGER, paused_by TEXT, pause_note TEXT, retired_at INTEGER,
  ticks_fired INTEGER NOT NULL DEFAULT 0, ticks_skipped INTEGER NOT NULL DEFAULT 0,
  ticks_missed INTEGER NOT NULL DEFAULT 0, CHECK ((cron IS NULL) <> (every_ms IS NULL))) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS asyncq_schedule_events (seq INTEGER PRIMARY KEY AUTOINCREMENT,
  schedule TEXT NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('overlap', 'queue_paused',
  'paused', 'missed', 'pause', 'resume', 'run_now', 'declared', 'changed', 'retired')), tick_ms INTEGER,
  through_ms INTEGER, ticks INTEGER NOT NULL DEFAULT 1, job_id TEXT, actor TEXT, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS asyncq_schedule_events_schedule ON asyncq_schedule_events(schedule, seq)",
)

_COLUMNS = ", ".join(f"s.{name}" for name in COLUMNS)
_DEFINITION = NewSchedule._fields
_EVALUATED = f"""
SELECT {_COLUMNS}, j.status, j.lease_until, q.paused_at FROM asyncq_schedules s
LEFT JOIN asyncq_jobs j ON j.id = s.last_job LEFT JOIN asyncq_queues q ON q.queue = s.queue
"""
LIVE = _EVALUATED + "WHERE s.retired_at IS NULL ORDER BY s.name"
ONE = _EVALUATED + "WHERE s.name = :name"
ALL = f"SELECT {_COLUMNS} FROM asyncq_schedules s ORDER BY s.name"
NAMED = f"SELECT {_COLUMNS} FROM asyncq_schedules s WHERE s.name IN (SELECT value FROM json_each(:names))"
INSERT = f"""
INSERT INTO asyncq_schedules ({", ".join(_DEFINITION)}, declared_at, revision, next_tick)
VALUES ({", ".join(":" + name for name in _DEFINITION)}, :declared_at, 1, :next_tick)
"""
REDEFINE = f"""
UPDATE asyncq_schedules SET {", ".join(f"{name} = :{name}" for name in _DEFINITION[1:])}, declared_at = :declared_at,
  next_tick = :next_tick, retired_at = NULL, revision = revision + 1
WHERE name = :name AND revision = :revision
"""
RETIRE = """
UPDATE asyncq_schedules SET retired_at = :now, next_tick = NULL, queued_tick = NULL, revision = revision + 1
WHERE name = :name AND revision = :revision
"""
ADVANCE = """
UPDATE asyncq_schedules SET last_tick = :last_tick, next_tick = :next_tick, queued_tick = :queued_tick,
  last_job = coalesce(:last_job, last_job), revision = revision + 1, ticks_fired = ticks_fired + :fired,
  ticks_skipped = ticks_skipped + :skipped, ticks_missed = ticks_missed + :missed
WHERE name = :name AND revision = :revision AND last_tick IS :old_last_tick
"""
SET_PAUSED = """
UPDATE asyncq_schedules SET paused_at = :paused_at, paused_by = :actor, pause_note = :note, revision = revision + 1
WHERE name = :name
"""
RAN_NOW = "UPDATE asyncq_schedules SET last_job = :job, revision = revision + 1 WHERE name = :name"
_EVENT_COLUMNS = ", ".join(EVENT_COLUMNS)
INSERT_EVENT = f"""
INSERT INTO asyncq_schedule_events ({", ".join(EVENT_COLUMNS[1:])})
VALUES (:schedule, :at_ms, :kind, :tick_ms, :through_ms, :ticks, :job_id, :actor, :note) RETURNING {_EVENT_COLUMNS}
"""
INSERT_TICK_EVENT = """
INSERT INTO asyncq_schedule_events (schedule, at_ms, kind, tick_ms, through_ms, ticks) VALUES (?, ?, ?, ?, ?, ?)
"""
TRIM_EVENTS = """
DELETE FROM asyncq_schedule_events WHERE schedule = :name AND tick_ms IS NOT NULL AND seq <= (
  SELECT seq FROM asyncq_schedule_events WHERE schedule = :name AND tick_ms IS NOT NULL ORDER BY seq DESC
  LIMIT 1 OFFSET :keep)
"""
EVENTS = f"""
SELECT {_EVENT_COLUMNS} FROM asyncq_schedule_events WHERE (:name IS NULL OR schedule = :name)
  AND (NOT :ticks OR tick_ms IS NOT NULL) ORDER BY seq DESC LIMIT :limit
"""


def _evaluated(row: Sequence[Any]) -> Evaluated:
    width = len(COLUMNS)
    return Evaluated(Schedule.from_row(row[:width]), Previous(row[width], row[width + 1]), row[width + 2] is not None)


def live(con: sqlite3.Connection) -> list[Evaluated]:
    """Every schedule not retired, with its newest run's state and its queue's pause: what an evaluation reads."""
    return [_evaluated(row) for row in con.execute(LIVE)]


def all_schedules(con: sqlite3.Connection) -> list[Schedule]:
    """Every schedule, retired ones included, by name."""
    return [Schedule.from_row(row) for row in con.execute(ALL)]


def events(con: sqlite3.Connection, name: str | None, limit: int, ticks: bool) -> list[ScheduleEvent]:
    """The newest ``limit`` events (of ``name`` only, if given; ticks that did not run only, if ``ticks``), newest
    first."""
    found = con.execute(EVENTS, {"name": name, "limit": limit, "ticks": ticks})
    return [ScheduleEvent(*row) for row in found]


def _event(con: sqlite3.Connection, name: str, at_ms: int, kind: str, **fields: Any) -> ScheduleEvent:
    values = {"tick_ms": None, "through_ms": None, "ticks": 1, "job_id": None, "actor": None, "note": None}
    row = con.execute(INSERT_EVENT, values | fields | {"schedule": name, "at_ms": at_ms, "kind": kind}).fetchone()
    return ScheduleEvent(*row)


def declare(
    con: sqlite3.Connection, rows: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int, actor: str
) -> list[ScheduleEvent]:
    """Upsert ``rows`` and retire the undeclared schedules of ``scope`` (``core.schedule_plan.plan_declarations``),
    one transaction; the events it wrote."""
    with write_transaction(con):
        plan = plan_declarations({s.name: s for s in all_schedules(con)}, rows, scope, now_ms)
        for row in plan.added:
            assert row.definition is not None
            con.execute(INSERT, row.definition._asdict() | {"declared_at": now_ms, "next_tick": row.next_tick})
        for row, revision in plan.updated:
            _redefine(con, row, revision, now_ms)
        return [_declared_event(con, row, now_ms, actor) for row in plan.changed]


def _redefine(con: sqlite3.Connection, row: Declared, revision: int, now_ms: int) -> None:
    key = {"name": row.name, "revision": revision}
    if row.definition is None:
        done = con.execute(RETIRE, key | {"now": now_ms})
    else:
        values = row.definition._asdict() | {"declared_at": row.declared_at, "next_tick": row.next_tick}
        done = con.execute(REDEFINE, values | key)
    assert done.rowcount == 1  # read under the write lock


def _declared_event(con: sqlite3.Connection, row: Declared, now_ms: int, actor: str) -> ScheduleEvent:
    note = "no longer declared" if row.definition is None else timing_text(row.definition)
    return _event(con, row.name, now_ms, row.kind, actor=actor, note=note)


def advance(con: sqlite3.Connection, name: str, revision: int, now_ms: int) -> Advanced | None:
    """One evaluation of schedule ``name`` at ``now_ms``, if its row is still at ``revision`` (``None``: another
    evaluation or a move changed it first, or nothing was due): its due ticks' jobs and events, in one transaction."""
    with write_transaction(con):
        found = con.execute(ONE, {"name": name}).fetchone()
        seen = None if found is None else _evaluated(found)
        if seen is None or seen.schedule.revision != revision:
            return None
        plan = plan_step(seen, now_ms)
        if not plan.changes or not _apply(con, seen.schedule, plan, now_ms):
            return None
        if FAULT is not None:
            FAULT("schedule-tick")
        jobs = tuple(schedule_job_id(name, tick) for tick in plan.fire)
        return Advanced(name, jobs, plan.skipped, plan.missed, plan.next_tick)


def _apply(con: sqlite3.Connection, schedule: Schedule, plan: StepPlan, now_ms: int) -> bool:
    """Write ``plan``: the row's compare-and-set first (``False``, nothing written, if it lost), then the jobs and
    the events (the oldest tick events beyond ``KEPT_TICK_EVENTS`` go)."""
    name = schedule.name
    jobs = [schedule_job(schedule.definition, schedule_job_id(name, tick), now_ms) for tick in plan.fire]
    values = {"name": name, "revision": schedule.revision, "old_last_tick": schedule.last_tick}
    values |= {"last_tick": plan.last_tick, "next_tick": plan.next_tick, "queued_tick": plan.queued_tick}
    values |= {"last_job": jobs[-1].id if jobs else None, "fired": plan.fired, "skipped": plan.skipped}
    if con.execute(ADVANCE, values | {"missed": plan.missed}).rowcount != 1:
        return False
    if jobs:
        enqueue_rows_in_transaction(con, PRODUCT, jobs)
    con.executemany(INSERT_TICK_EVENT, [(name, now_ms, *event) for event in plan.events])
    if plan.events:
        con.execute(TRIM_EVENTS, {"name": name, "keep": KEPT_TICK_EVENTS})
    return True


def set_paused(con: sqlite3.Connection, name: str, paused: bool, now_ms: int, note: str, actor: str) -> ScheduleEvent:
    """Pause or resume ``name`` with its event; ``ValueError`` (nothing changes) if there is no such schedule, it is
    retired, or already in that state. A resume first writes the ticks that came due while paused as ``paused``."""
    with write_transaction(con):
        return set_paused_in_transaction(con, name, paused, now_ms, note, actor)


def set_paused_in_transaction(
    con: sqlite3.Connection, name: str, paused: bool, now_ms: int, note: str, actor: str
) -> ScheduleEvent:
    """``set_paused`` inside the caller's write transaction (a console's action on several schedules)."""
    found = con.execute(ONE, {"name": name}).fetchone()
    seen = None if found is None else _evaluated(found)
    refused = move_refused(name, None if seen is None else seen.schedule, pausing=paused)
    if refused is not None:
        raise ValueError(refused)
    assert seen is not None
    if not paused:
        plan = plan_step(seen, now_ms)
        if plan.changes:
            _apply(con, seen.schedule, plan, now_ms)
    state = (now_ms, actor, note) if paused else (None, None, None)
    con.execute(SET_PAUSED, dict(zip(("paused_at", "actor", "note"), state, strict=True)) | {"name": name})
    return _event(con, name, now_ms, PAUSE if paused else RESUME, actor=actor, note=note)


def run_now(con: sqlite3.Connection, name: str, now_ms: int, note: str, actor: str) -> ScheduleEvent:
    """A job of ``name`` now (its stored tick unmoved), recorded as its newest run, with a ``run_now`` event naming
    it; ``ValueError`` if there is no such schedule or it is retired."""
    with write_transaction(con):
        return run_now_in_transaction(con, name, now_ms, note, actor)


def run_now_in_transaction(con: sqlite3.Connection, name: str, now_ms: int, note: str, actor: str) -> ScheduleEvent:
    """``run_now`` inside the caller's write transaction."""
    found = con.execute(ONE, {"name": name}).fetchone()
    schedule = None if found is None else _evaluated(found).schedule
    refused = move_refused(name, schedule)
    if refused is not None:
        raise ValueError(refused)
    assert schedule is not None
    job_id = run_now_job_id(name, now_ms)
    enqueue_rows_in_transaction(con, PRODUCT, [schedule_job(schedule.definition, job_id, now_ms)])
    con.execute(RAN_NOW, {"name": name, "job": job_id})
    return _event(con, name, now_ms, RUN_NOW, job_id=job_id, actor=actor, note=note)


def named(con: sqlite3.Connection, names: Sequence[str]) -> dict[str, Schedule | None]:
    """The schedules of these names as stored (``None``: no such schedule)."""
    found = {row[0]: Schedule.from_row(row) for row in con.execute(NAMED, {"names": json.dumps(list(names))})}
    return {name: found.get(name) for name in names}
