"""Schedules on PostgreSQL (``schedules``, ``schedule_events``): each call's steps run inside the transaction the
caller holds, deciding by ``core.schedule_plan``. A tick's jobs are inserted after the schedule row's update, a
compare-and-set on the revision and the last tick it was planned from: under ``READ COMMITTED`` a concurrent
evaluation's update makes this one wait for its commit, then match nothing, and its transaction writes nothing
(``docs/schedules.md``). Declarations take a transaction-scoped advisory lock of the schema's schedules, so hosts
starting at once declare one after the other; operators' moves lock the row."""

from __future__ import annotations

import hashlib
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
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.statements import NOTIFY
from asyncq.store.postgres.transitions import enqueue_rows

#: Tests only: called inside a tick's transaction once its rows are written, before the commit (a test's child
#: process blocks here and is killed).
FAULT: Callable[[str], object] | None = None

# Version 9: schedules as stored state (the SQLite store's v12, docs/schedules.md): one row per schedule and the
# events of its skipped and missed ticks and of every move on it.
SCHEDULE_TABLES = (
    """CREATE TABLE {schema}.schedules (
  name text PRIMARY KEY,
  cron text,
  every_ms bigint,
  tz text NOT NULL,
  overlap text NOT NULL CHECK (overlap IN ('skip', 'queue_one', 'allow')),
  missed text NOT NULL CHECK (missed IN ('latest', 'skip', 'all')),
  task text NOT NULL,
  queue text NOT NULL,
  body text NOT NULL,
  priority smallint NOT NULL,
  max_attempts integer NOT NULL,
  ttl_ms bigint NOT NULL,
  declared_at bigint NOT NULL,
  revision bigint NOT NULL,
  last_tick bigint,
  next_tick bigint,
  queued_tick bigint,
  last_job text,
  paused_at bigint,
  paused_by text,
  pause_note text,
  retired_at bigint,
  ticks_fired bigint NOT NULL DEFAULT 0,
  ticks_skipped bigint NOT NULL DEFAULT 0,
  ticks_missed bigint NOT NULL DEFAULT 0,
  CHECK ((cron IS NULL) <> (every_ms IS NULL))
)""",
    """CREATE TABLE {schema}.schedule_events (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  schedule text NOT NULL,
  at_ms bigint NOT NULL,
  kind text NOT NULL CHECK (kind IN ('overlap', 'queue_paused', 'paused', 'missed', 'pause', 'resume', 'run_now',
    'declared', 'changed', 'retired')),
  tick_ms bigint,
  through_ms bigint,
  ticks bigint NOT NULL DEFAULT 1,
  job_id text,
  actor text,
  note text
)""",
    "CREATE INDEX schedule_events_schedule ON {schema}.schedule_events (schedule, seq)",
)

_COLUMNS = ", ".join(f"s.{name}" for name in COLUMNS)
_DEFINITION = NewSchedule._fields
_EVALUATED = f"""
SELECT {_COLUMNS}, j.status, j.lease_until, q.paused_at FROM {{schema}}.schedules s
LEFT JOIN {{schema}}.jobs j ON j.id = s.last_job LEFT JOIN {{schema}}.queues q ON q.queue = s.queue
"""
LIVE = _EVALUATED + "WHERE s.retired_at IS NULL ORDER BY s.name"
ONE = _EVALUATED + "WHERE s.name = $1"
LOCK_ONE = f"SELECT {_COLUMNS} FROM {{schema}}.schedules s WHERE s.name = $1 FOR UPDATE"
ALL = f"SELECT {_COLUMNS} FROM {{schema}}.schedules s ORDER BY s.name"
LOCK_NAMED = f"SELECT {_COLUMNS} FROM {{schema}}.schedules s WHERE s.name = ANY($1::text[]) ORDER BY s.name FOR UPDATE"
LOCK_ALL = ALL + " FOR UPDATE"
_DEFINITION_PARAMS = ", ".join(f"${n}" for n in range(1, len(_DEFINITION) + 1))
INSERT = f"""
INSERT INTO {{schema}}.schedules ({", ".join(_DEFINITION)}, declared_at, revision, next_tick)
VALUES ({_DEFINITION_PARAMS}, ${len(_DEFINITION) + 1}, 1, ${len(_DEFINITION) + 2})
"""
_REDEFINED = ", ".join((*_DEFINITION[1:], "declared_at", "next_tick"))
_REDEFINED_PARAMS = ", ".join(f"${n}" for n in range(2, len(_DEFINITION) + 3))
REDEFINE = f"""
UPDATE {{schema}}.schedules SET ({_REDEFINED}) = ({_REDEFINED_PARAMS}), retired_at = NULL, revision = revision + 1
WHERE name = $1 AND revision = ${len(_DEFINITION) + 3}
"""
RETIRE = """
UPDATE {schema}.schedules SET retired_at = $3, next_tick = NULL, queued_tick = NULL, revision = revision + 1
WHERE name = $1 AND revision = $2
"""
ADVANCE = """
UPDATE {schema}.schedules SET last_tick = $4, next_tick = $5, queued_tick = $6, last_job = coalesce($7, last_job),
  revision = revision + 1, ticks_fired = ticks_fired + $8, ticks_skipped = ticks_skipped + $9,
  ticks_missed = ticks_missed + $10
WHERE name = $1 AND revision = $2 AND last_tick IS NOT DISTINCT FROM $3::bigint
"""
SET_PAUSED = """
UPDATE {schema}.schedules SET paused_at = $2, paused_by = $3, pause_note = $4, revision = revision + 1 WHERE name = $1
"""
RAN_NOW = "UPDATE {schema}.schedules SET last_job = $2, revision = revision + 1 WHERE name = $1"
INSERT_EVENT = f"""
INSERT INTO {{schema}}.schedule_events ({", ".join(EVENT_COLUMNS[1:])})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {", ".join(EVENT_COLUMNS)}
"""
INSERT_TICK_EVENT = """
INSERT INTO {schema}.schedule_events (schedule, at_ms, kind, tick_ms, through_ms, ticks) VALUES ($1, $2, $3, $4, $5, $6)
"""
TRIM_EVENTS = """
DELETE FROM {schema}.schedule_events WHERE schedule = $1 AND tick_ms IS NOT NULL AND seq <= (
  SELECT seq FROM {schema}.schedule_events WHERE schedule = $1 AND tick_ms IS NOT NULL ORDER BY seq DESC
  LIMIT 1 OFFSET $2)
"""
EVENTS = f"""
SELECT {", ".join(EVENT_COLUMNS)} FROM {{schema}}.schedule_events WHERE ($1::text IS NULL OR schedule = $1)
  AND (NOT $2 OR tick_ms IS NOT NULL) ORDER BY seq DESC LIMIT $3
"""


def declarations_key(schema: str) -> int:
    """The advisory lock every declaration of ``schema``'s schedules takes (a signed 64-bit number of its name)."""
    digest = hashlib.blake2b(f"asyncq-schedules:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _evaluated(row: Any) -> Evaluated:
    width = len(COLUMNS)
    return Evaluated(Schedule.from_row(row[:width]), Previous(row[width], row[width + 1]), row[width + 2] is not None)


async def live(conn: Connection, schema: str) -> list[Evaluated]:
    """Every schedule not retired, with its newest run's state and its queue's pause."""
    return [_evaluated(tuple(row)) for row in await conn.fetch(LIVE.format(schema=schema))]


async def all_schedules(conn: Connection, schema: str) -> list[Schedule]:
    """Every schedule, retired ones included, by name."""
    return [Schedule.from_row(row) for row in await conn.fetch(ALL.format(schema=schema))]


async def events(conn: Connection, schema: str, name: str | None, limit: int, ticks: bool) -> list[ScheduleEvent]:
    """The newest ``limit`` events (of ``name``; ticks that did not run only, if ``ticks``), newest first."""
    return [ScheduleEvent(*row) for row in await conn.fetch(EVENTS.format(schema=schema), name, ticks, limit)]


async def _event(conn: Connection, schema: str, name: str, at_ms: int, kind: str, **fields: Any) -> ScheduleEvent:
    values = {"tick_ms": None, "through_ms": None, "ticks": 1, "job_id": None, "actor": None, "note": None} | fields
    row = await conn.fetchrow(INSERT_EVENT.format(schema=schema), name, at_ms, kind, *values.values())
    assert row is not None  # INSERT … RETURNING returns the row it inserted
    return ScheduleEvent(*row)


async def declare(
    conn: Connection, schema: str, rows: Sequence[NewSchedule], scope: Sequence[str] | None, now_ms: int, actor: str
) -> list[ScheduleEvent]:
    """Upsert ``rows`` and retire the undeclared schedules of ``scope``, under the declarations' advisory lock and
    every row locked; the events written."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", declarations_key(schema))
    existing = [Schedule.from_row(row) for row in await conn.fetch(LOCK_ALL.format(schema=schema))]
    plan = plan_declarations({s.name: s for s in existing}, rows, scope, now_ms)
    for row in plan.added:
        assert row.definition is not None
        await conn.execute(INSERT.format(schema=schema), *row.definition, now_ms, row.next_tick)
    for row, revision in plan.updated:
        await _redefine(conn, schema, row, revision, now_ms)
    return [await _declared_event(conn, schema, row, now_ms, actor) for row in plan.changed]


async def _redefine(conn: Connection, schema: str, row: Declared, revision: int, now_ms: int) -> None:
    if row.definition is None:
        done = await conn.execute(RETIRE.format(schema=schema), row.name, revision, now_ms)
    else:
        values = (*row.definition[1:], row.declared_at, row.next_tick)
        done = await conn.execute(REDEFINE.format(schema=schema), row.name, *values, revision)
    assert done == "UPDATE 1", done  # every row is locked


async def _declared_event(conn: Connection, schema: str, row: Declared, now_ms: int, actor: str) -> ScheduleEvent:
    note = "no longer declared" if row.definition is None else timing_text(row.definition)
    return await _event(conn, schema, row.name, now_ms, row.kind, actor=actor, note=note)


async def advance(
    conn: Connection, schema: str, name: str, revision: int, now_ms: int, channel: str
) -> Advanced | None:
    """One evaluation of ``name`` at ``now_ms`` if its row is still at ``revision`` (``None``: it changed, another
    evaluation won the compare-and-set, or nothing was due); ``channel`` is told of new jobs at the commit."""
    found = await conn.fetchrow(ONE.format(schema=schema), name)
    seen = None if found is None else _evaluated(tuple(found))
    if seen is None or seen.schedule.revision != revision:
        return None
    plan = plan_step(seen, now_ms)
    if not plan.changes or not await _apply(conn, schema, seen.schedule, plan, now_ms, channel):
        return None
    if FAULT is not None:
        FAULT("schedule-tick")
    return Advanced(name, tuple(schedule_job_id(name, tick) for tick in plan.fire), plan.skipped, plan.missed,
                    plan.next_tick)  # fmt: skip


async def _apply(conn: Connection, schema: str, schedule: Schedule, plan: StepPlan, now_ms: int, channel: str) -> bool:
    """Write ``plan``: the row's compare-and-set first (``False``, nothing written, if it lost), then the jobs (and
    their NOTIFY) and the events (the oldest tick events beyond ``KEPT_TICK_EVENTS`` go)."""
    name = schedule.name
    jobs = [schedule_job(schedule.definition, schedule_job_id(name, tick), now_ms) for tick in plan.fire]
    done = await conn.execute(
        ADVANCE.format(schema=schema), name, schedule.revision, schedule.last_tick, plan.last_tick, plan.next_tick,
        plan.queued_tick, jobs[-1].id if jobs else None, plan.fired, plan.skipped, plan.missed,
    )  # fmt: skip
    if done != "UPDATE 1":
        return False
    if jobs:
        await enqueue_rows(conn, schema, jobs)
        await conn.execute(NOTIFY, channel)
    if plan.events:
        await conn.executemany(
            INSERT_TICK_EVENT.format(schema=schema), [(name, now_ms, *event) for event in plan.events]
        )
        await conn.execute(TRIM_EVENTS.format(schema=schema), name, KEPT_TICK_EVENTS)
    return True


async def set_paused(
    conn: Connection, schema: str, name: str, paused: bool, now_ms: int, note: str, actor: str
) -> ScheduleEvent:
    """Pause or resume ``name`` (its row locked) with its event; ``ValueError`` if it is missing, retired or in that
    state already: the caller's transaction rolls back. A resume first writes the ticks due while paused."""
    await conn.fetchrow(LOCK_ONE.format(schema=schema), name)
    found = await conn.fetchrow(ONE.format(schema=schema), name)
    seen = None if found is None else _evaluated(tuple(found))
    refused = move_refused(name, None if seen is None else seen.schedule, pausing=paused)
    if refused is not None:
        raise ValueError(refused)
    assert seen is not None
    if not paused:
        plan = plan_step(seen, now_ms)
        if plan.changes:
            await _apply(conn, schema, seen.schedule, plan, now_ms, "")
    state = (now_ms, actor, note) if paused else (None, None, None)
    await conn.execute(SET_PAUSED.format(schema=schema), name, *state)
    return await _event(conn, schema, name, now_ms, PAUSE if paused else RESUME, actor=actor, note=note)


async def run_now(
    conn: Connection, schema: str, name: str, now_ms: int, note: str, actor: str, channel: str
) -> ScheduleEvent:
    """A job of ``name`` now (its stored tick unmoved), recorded as its newest run, with its ``run_now`` event;
    ``ValueError`` if it is missing or retired."""
    found = await conn.fetchrow(LOCK_ONE.format(schema=schema), name)
    schedule = None if found is None else Schedule.from_row(found)
    refused = move_refused(name, schedule)
    if refused is not None:
        raise ValueError(refused)
    assert schedule is not None
    job_id = run_now_job_id(name, now_ms)
    await enqueue_rows(conn, schema, [schedule_job(schedule.definition, job_id, now_ms)])
    await conn.execute(NOTIFY, channel)
    await conn.execute(RAN_NOW.format(schema=schema), name, job_id)
    return await _event(conn, schema, name, now_ms, RUN_NOW, job_id=job_id, actor=actor, note=note)


async def named(conn: Connection, schema: str, names: Sequence[str]) -> dict[str, Schedule | None]:
    """The schedules of these names, their rows locked (in name order) until the caller's transaction ends
    (``None``: no such schedule)."""
    rows = await conn.fetch(LOCK_NAMED.format(schema=schema), list(names))
    found = {row[0]: Schedule.from_row(row) for row in rows}
    return {name: found.get(name) for name in names}
