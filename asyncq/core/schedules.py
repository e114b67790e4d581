"""Schedules as stored state (no I/O here): what is declared (``ScheduleSpec``, checked into a ``NewSchedule``), what
a store keeps (``Schedule``: the definition, its last tick, next tick, pause and retirement, its counters), the events
it writes (``ScheduleEvent``: skipped and missed ticks, and every move on a schedule), the job a tick becomes, and the
limits. When ticks are due and what each becomes is ``core.schedule_plan``'s; ``docs/schedules.md`` tells the rules.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from asyncq.core.cron import Cron, check_zone
from asyncq.core.jobs import MAX_BODY_BYTES, NewJob, body_text, task_of
from asyncq.core.jsontext import JSONInput
from asyncq.core.limits import DAY_MS, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, DEFAULT_TTL_MS, MAX_ATTEMPTS, MAX_TTL_MS
from asyncq.core.values import (
    Duration,
    check_choice,
    check_identifier,
    check_int,
    check_priority,
    duration_ms,
)

#: What happens to a tick while the previous run of its schedule is pending or holds a live lease: ``skip`` it (an
#: event says so), ``queue_one`` (hold one tick, run it once the previous run has ended; further ones are skipped),
#: or ``allow`` (run it anyway).
OVERLAP_POLICIES = ("skip", "queue_one", "allow")
#: What happens to ticks that came due while no process evaluated (downtime, a clock moved): ``latest`` (one run,
#: for the newest of them; the others are missed events), ``skip`` (none runs unless the newest is at most
#: ``MISSED_GRACE_MS`` late), or ``all`` (each runs, the newest ``MAX_CATCH_UP`` at most; older ones are missed).
MISSED_POLICIES = ("latest", "skip", "all")
Overlap = Literal["skip", "queue_one", "allow"]
Missed = Literal["latest", "skip", "all"]

#: Why a tick did not run (an event's ``kind``): the previous run was still active; it was pending in a paused
#: queue; the schedule was paused; the missed policy dropped it.
OVERLAP, QUEUE_PAUSED, PAUSED, MISSED = "overlap", "queue_paused", "paused", "missed"
TICK_KINDS = (OVERLAP, QUEUE_PAUSED, PAUSED, MISSED)
#: The moves on a schedule its events keep: an operator's (pause, resume, run now) and a deployment's (declared:
#: new or revived; changed; retired: no longer declared).
PAUSE, RESUME, RUN_NOW, DECLARED, CHANGED, RETIRED = "pause", "resume", "run_now", "declared", "changed", "retired"
MOVE_KINDS = (PAUSE, RESUME, RUN_NOW, DECLARED, CHANGED, RETIRED)
EVENT_KINDS = TICK_KINDS + MOVE_KINDS

MIN_EVERY_MS = 100  # an interval schedule's shortest period
MAX_EVERY_MS = 366 * DAY_MS
#: ``missed="all"``: at most this many runs of one evaluation; the older missed ticks are written as missed.
MAX_CATCH_UP = 100
#: At most this many tick events one evaluation writes one per tick; the rest of a long run of missed (or paused)
#: ticks is one event for the range (``tick_ms`` … ``through_ms``).
MAX_TICK_EVENTS = 100
#: ``missed="skip"``: the newest due tick still runs when it is at most this late.
MISSED_GRACE_MS = 60_000
#: Tick events a store keeps per schedule (older ones go in the transaction that writes new ones); moves stay.
KEPT_TICK_EVENTS = 1000
MAX_TASK_CHARS = 200
#: A schedule's jobs' ids start with this (``schedule_job_id``).
JOB_PREFIX = "sch-"


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule to declare (``Queue.declare_schedules``; ``@app.periodic`` builds one per task): ``name`` (1-64
    ASCII letters, digits, ``_``, ``-``: the schedule's identity), the job each tick enqueues (``body``, ``queue``,
    ``priority``, ``max_attempts``, ``ttl``), and when: ``cron`` (five fields, read in the IANA zone ``tz``) or
    ``every`` (seconds or a ``timedelta``, at least 0.1 s), one of them; ``overlap`` and ``missed`` policies
    (``docs/schedules.md``). ``task`` names the task for operators (``App.periodic`` sets it)."""

    name: str
    body: JSONInput
    cron: str | None = None
    every: Duration | None = None
    tz: str = "UTC"
    overlap: Overlap = "skip"
    missed: Missed = "latest"
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ttl: Duration | None = None
    task: str | None = field(default=None, kw_only=True)

    def to_row(self, max_body_bytes: int = MAX_BODY_BYTES) -> NewSchedule:
        """Every field checked (``TypeError``/``ValueError`` naming it), as the row a store keeps."""
        name = check_identifier(self.name, "name")
        if (self.cron is None) == (self.every is None):
            raise ValueError(f"schedule {name!r} needs cron=… or every=…, one of them")
        cron = None if self.cron is None else Cron.parse(self.cron).text
        every_ms = None if self.every is None else duration_ms(self.every, "every", 0, MIN_EVERY_MS, MAX_EVERY_MS)
        task = name if self.task is None else _check_task(self.task)
        return NewSchedule(
            name=name,
            cron=cron,
            every_ms=every_ms,
            tz=check_zone(self.tz),
            overlap=check_choice(self.overlap, "overlap", OVERLAP_POLICIES),
            missed=check_choice(self.missed, "missed", MISSED_POLICIES),
            task=task,
            queue=check_identifier(self.queue, "queue"),
            body=body_text(self.body, max_body_bytes),
            priority=check_priority(self.priority),
            max_attempts=check_int(self.max_attempts, "max_attempts", 1, MAX_ATTEMPTS),
            ttl_ms=DEFAULT_TTL_MS if self.ttl is None else duration_ms(self.ttl, "ttl", DEFAULT_TTL_MS, 1, MAX_TTL_MS),
        )


def _check_task(value: object) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_TASK_CHARS or not value.isprintable():
        raise ValueError(f"task must be 1-{MAX_TASK_CHARS} printable characters, not {value!r}")
    return value


class NewSchedule(NamedTuple):
    """A declared schedule's checked definition: what a store upserts by ``name``."""

    name: str
    cron: str | None
    every_ms: int | None
    tz: str
    overlap: str
    missed: str
    task: str
    queue: str
    body: str
    priority: int
    max_attempts: int
    ttl_ms: int

    def timing(self) -> tuple[str | None, int | None, str]:
        """What decides the ticks: a change of it counts the ticks afresh from the declaration."""
        return self.cron, self.every_ms, self.tz


#: ``Schedule``'s stored columns after the definition, in the stores' order.
STATE_COLUMNS = ("declared_at", "revision", "last_tick", "next_tick", "queued_tick", "last_job", "paused_at",
                 "paused_by", "pause_note", "retired_at", "ticks_fired", "ticks_skipped", "ticks_missed")  # fmt: skip
COLUMNS = NewSchedule._fields + STATE_COLUMNS


@dataclass(frozen=True)
class Schedule:
    """A schedule as a store keeps it: its definition; ``declared_at`` (ticks count after the later of it and
    ``last_tick``); ``revision`` (every write adds one: the compare-and-set of a tick checks it); ``last_tick`` (the
    newest tick decided: run, skipped or missed; UTC ms) and ``next_tick`` (``None`` once retired); ``queued_tick``
    (``queue_one``: a tick held until the previous run ends); ``last_job`` (the id of its newest run: a tick's or a
    run now's); paused (since, by whom, why); ``retired_at``; and how many ticks it fired, skipped and missed."""

    definition: NewSchedule
    declared_at: int
    revision: int
    last_tick: int | None
    next_tick: int | None
    queued_tick: int | None
    last_job: str | None
    paused_at: int | None
    paused_by: str | None
    pause_note: str | None
    retired_at: int | None
    ticks_fired: int
    ticks_skipped: int
    ticks_missed: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...] | Any) -> Schedule:
        """A store's row of ``COLUMNS`` in order."""
        values = tuple(row)
        width = len(NewSchedule._fields)
        return cls(NewSchedule(*values[:width]), *values[width : len(COLUMNS)])

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def retired(self) -> bool:
        return self.retired_at is not None

    @property
    def base(self) -> int:
        """The instant the next tick follows: the later of the last tick and the declaration."""
        return self.declared_at if self.last_tick is None else max(self.last_tick, self.declared_at)

    def record(self) -> dict[str, Any]:
        """Every field by name, flat (what the CLI prints with ``--json``)."""
        return self.definition._asdict() | {name: getattr(self, name) for name in STATE_COLUMNS}


@dataclass(frozen=True)
class ScheduleEvent:
    """One event of a schedule, at ``at_ms``: a tick that did not run (``kind`` in ``TICK_KINDS``; ``tick_ms``, and
    for a range written as one event ``through_ms`` and how many ``ticks`` it stands for) or a move (``MOVE_KINDS``:
    who, why, and for a run now its ``job_id``)."""

    seq: int
    schedule: str
    at_ms: int
    kind: str
    tick_ms: int | None = None
    through_ms: int | None = None
    ticks: int = 1
    job_id: str | None = None
    actor: str | None = None
    note: str | None = None

    @property
    def skipped_tick(self) -> bool:
        """Whether it is a tick that did not run (not a move)."""
        return self.kind in TICK_KINDS


#: ``ScheduleEvent``'s columns, in the stores' order.
EVENT_COLUMNS = ("seq", "schedule", "at_ms", "kind", "tick_ms", "through_ms", "ticks", "job_id", "actor", "note")


@dataclass(frozen=True)
class Advanced:
    """What one evaluation of a schedule wrote: the ids of the jobs its ticks became (in tick order), how many ticks
    it skipped and missed, and the row's next tick."""

    name: str
    jobs: tuple[str, ...]
    skipped: int
    missed: int
    next_tick: int | None


def move_refused(name: str, schedule: Schedule | None, *, pausing: bool | None = None) -> str | None:
    """Why an operator's move on schedule ``name`` changes nothing (``None``: it goes ahead): there is none, it is
    retired, or (``pausing`` True/False) it is paused already / is not paused."""
    if schedule is None:
        return f"no schedule named {name!r}"
    if schedule.retired:
        return f"schedule {name!r} is retired (no worker declares it any more)"
    if pausing is True and schedule.paused:
        return f"schedule {name!r} is already paused (by {schedule.paused_by}: {schedule.pause_note})"
    if pausing is False and not schedule.paused:
        return f"schedule {name!r} is not paused"
    return None


def timing_text(schedule: NewSchedule) -> str:
    """``cron */5 * * * * (Europe/Berlin)`` or ``every 30s``: when a schedule ticks, for operators."""
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.tz})"
    assert schedule.every_ms is not None
    every = schedule.every_ms
    return f"every {every // 1000}s" if every % 1000 == 0 else f"every {every}ms"


class Previous(NamedTuple):
    """The stored state of a schedule's newest run (``None`` fields: no such job, or it was removed)."""

    status: str | None = None
    lease_until: int | None = None

    def active(self, now_ms: int) -> bool:
        """Whether it still runs or waits to: pending, or leased under a live lease."""
        if self.status == "pending":
            return True
        return self.status == "leased" and self.lease_until is not None and self.lease_until > now_ms


@dataclass(frozen=True)
class Evaluated:
    """A schedule as an evaluation reads it: the row, its newest run's state, whether its queue is paused."""

    schedule: Schedule
    previous: Previous = field(default_factory=Previous)
    queue_paused: bool = False


def schedule_job_id(name: str, tick_ms: int) -> str:
    """The id of the job of ``name``'s tick at ``tick_ms``: the same in every process, so one tick is one job."""
    return f"{_id_part(name)}-{tick_ms}"


def run_now_job_id(name: str, now_ms: int) -> str:
    """The id of a "run now" of ``name`` at ``now_ms``."""
    return f"{_id_part(name)}-now-{now_ms}"


def _id_part(name: str) -> str:
    """``sch-NAME``, or for a name too long to leave room for a tick in 64 characters, a digest of it."""
    if len(JOB_PREFIX) + len(name) + 21 <= 64:
        return JOB_PREFIX + name
    return JOB_PREFIX + "h" + hashlib.sha256(name.encode()).hexdigest()[:24]


def schedule_job(schedule: NewSchedule, job_id: str, now_ms: int) -> NewJob:
    """The row a tick (or a run now) of ``schedule`` inserts at ``now_ms``: ready at once, its deadline ``ttl``
    away, the stored body, queue and priority, no unique key, group or limit key; its ``task`` column as an enqueue of
    the body sets it."""
    task = task_of(json.loads(schedule.body))
    payload = {"queue": schedule.queue, "body": schedule.body, "priority": schedule.priority, "unique_key": None,
               "task": task, "group_name": None, "limit_key": None}  # fmt: skip
    return NewJob(job_id, payload, schedule.max_attempts, now_ms, now_ms + schedule.ttl_ms)


@dataclass(frozen=True)
class ScheduleRun:
    """What one pass over a store's schedules did (``Queue.run_schedules``): the jobs its ticks became, how many
    ticks it skipped and missed, how many schedules it wrote (``advanced``) and how many another process (or a move)
    changed first (``lost``: that one wrote them), how many failed (logged); the soonest next tick of the live
    schedules (``None``: none), and whether a tick is held for a run still going (``queue_one``)."""

    jobs: tuple[str, ...] = ()
    skipped: int = 0
    missed: int = 0
    advanced: int = 0
    lost: int = 0
    failed: int = 0
    next_due: int | None = None
    waiting: bool = False
