"""Finding jobs for the operator's console, as values and one rule (no I/O): what a search asks (``JobQuery``), which
index serves it and what is checked on the rows that index yields (``plan_search``), and the cursor that pages it.

Every search walks one index in that index's own order and stops: a page reads at most ``scan`` rows that the
index yields (``MAX_SCAN``, the stated cap) and checks the other filters on them. When the cap is reached before
the page is full, the page says so (``JobPage.capped``) and its cursor goes on from the last row looked at, so the
next page continues the walk instead of starting over. Nothing ever sorts or counts a whole table.

The paths (each driver turns a path into its statements, ``asyncq.store.*.search``):

- ``ids``: the jobs named (at most ``MAX_IDS``), by their unique id;
- ``due``: one queue's pending jobs in the order they become ready (``available_at``, then ``seq``), from the index
  the claim uses; it serves the queue, the priority and the time range;
- ``error``: the jobs that failed an attempt with one error type, by ``seq``, from the errors' ``(type, job_seq)``
  index;
- ``dead`` and ``leased``: those statuses' partial indexes, by ``seq``;
- ``waiting``: the jobs with edges not met (the waiting ones among them: ``docs/dependencies.md``), by ``seq``;
- ``task``: one task's jobs (the ``task`` column an enqueue sets from a task's body), by ``seq``;
- ``seq``: every job by ``seq`` (the primary key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from asyncq.core.lifecycle import DEAD, DEAD_REASONS, LEASED, PENDING, STATUSES, WAITING
from asyncq.core.values import (
    TIME_MAX_MS,
    check_choice,
    check_identifier,
    check_int,
    check_priority,
    check_task_name,
    check_text,
)

if TYPE_CHECKING:
    from asyncq.core.jobs import Job

#: Rows of its index a search page looks at, at most (the stated cap on rows scanned).
MAX_SCAN = 10_000
#: Jobs a page shows, at most.
MAX_PAGE = 200
#: Ids one search (a selection of jobs) names, at most.
MAX_IDS = 1000
#: An error type's length (a qualified exception name).
MAX_ERROR_TYPE_CHARS = 200
#: Keys in a body path, and a key's length.
MAX_PATH_KEYS = 8
MAX_PATH_KEY_CHARS = 64


class Order(StrEnum):
    """How a search's jobs are listed: by ``seq`` (newest or oldest first), or ``due`` (the soonest ready first;
    one queue's pending jobs only)."""

    NEWEST = "newest"
    OLDEST = "oldest"
    DUE = "due"


class Path(StrEnum):
    """The index a search walks (see the module's docstring)."""

    IDS = "ids"
    DUE = "due"
    ERROR = "error"
    DEAD = "dead"
    LEASED = "leased"
    WAITING = "waiting"
    TASK = "task"
    SEQ = "seq"


@dataclass(frozen=True)
class BodyMatch:
    """A body (argument) path and the JSON scalar it must equal: ``path`` keys (a ``str``) and list indexes (an
    ``int``) from the body's top; ``value`` a string, an integer, a boolean or ``None`` (JSON null)."""

    path: tuple[str | int, ...]
    value: str | int | bool | None

    def value_json(self, *, ascii_only: bool = True) -> str:
        """The value as JSON text: as a body stores it (canonical, ASCII-escaped), or with ``ascii_only=False`` as
        PostgreSQL's ``jsonb`` prints it."""
        return json.dumps(self.value, ensure_ascii=ascii_only, separators=(",", ":"))

    @property
    def text(self) -> str:
        """``a.b.0 = value``, as the console shows and parses it."""
        return ".".join(str(key) for key in self.path) + " = " + self.value_json(ascii_only=False)


@dataclass(frozen=True)
class JobQuery:
    """Which jobs a search finds (``None``: any). ``since_ms``/``until_ms`` bound ``available_at`` (when a pending
    job is due, when an ended job ended), ``[since, until)``; ``error_type`` matches a job that failed any attempt
    with that exception type; ``task`` the task its body names (``Job.task``); ``ids`` names the jobs (an
    operator's selection)."""

    status: str | None = None
    queue: str | None = None
    task: str | None = None
    priority: int | None = None
    reason: str | None = None
    error_type: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    body: BodyMatch | None = None
    ids: tuple[str, ...] = ()

    def checked(self) -> JobQuery:
        """This query if every field is valid (``ValueError``/``TypeError`` naming the first that is not)."""
        if self.status is not None:
            check_choice(self.status, "status", STATUSES)
        if self.queue is not None:
            check_identifier(self.queue, "queue")
        if self.task is not None:
            check_task_name(self.task)
        if self.priority is not None:
            check_priority(self.priority)
        if self.reason is not None:
            check_choice(self.reason, "reason", DEAD_REASONS)
        if self.error_type is not None:
            check_text(self.error_type, "error_type", MAX_ERROR_TYPE_CHARS)
        for name in ("since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None:
                check_int(value, name, 0, TIME_MAX_MS)
        if self.body is not None:
            check_body_match(self.body)
        if type(self.ids) is not tuple or len(self.ids) > MAX_IDS:
            raise ValueError(f"ids must be a tuple of at most {MAX_IDS} job ids")
        for job_id in self.ids:
            check_identifier(job_id, "ids")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The filters given, as JSON values (an audit entry keeps them)."""
        found: dict[str, Any] = {}
        for name in ("status", "queue", "task", "priority", "reason", "error_type", "since_ms", "until_ms"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        if self.body is not None:
            found["body"] = self.body.text
        if self.ids:
            found["ids"] = list(self.ids)
        return found

    def matches(self, job: Job, error_types: frozenset[str] = frozenset()) -> bool:
        """Whether ``job`` (whose failed attempts had ``error_types``) is one this query finds: the definition
        every store's statements must agree with (the conformance suite compares them)."""
        checks = (
            (self.status, job.status),
            (self.queue, job.queue),
            (self.task, job.task),
            (self.priority, job.priority),
            (self.reason, job.reason),
        )
        if any(wanted is not None and wanted != value for wanted, value in checks):
            return False
        if self.error_type is not None and self.error_type not in error_types:
            return False
        if self.since_ms is not None and job.available_at < self.since_ms:
            return False
        if self.until_ms is not None and job.available_at >= self.until_ms:
            return False
        if self.ids and job.id not in self.ids:
            return False
        if self.body is None:
            return True
        found, value = body_value(job.body, self.body.path)
        return found and type(value) is type(self.body.value) and value == self.body.value


def body_value(body: object, path: tuple[str | int, ...]) -> tuple[bool, object]:
    """``(True, value)`` at ``path`` in ``body`` if there is a scalar there, ``(False, None)`` otherwise."""
    here = body
    for key in path:
        if isinstance(key, str) and isinstance(here, dict):
            if key not in here:
                return False, None
            here = here[key]
        elif isinstance(key, int) and isinstance(here, list) and 0 <= key < len(here):
            here = here[key]
        else:
            return False, None
    if isinstance(here, dict | list | float):
        return False, None
    return True, here


def check_body_match(match: object) -> BodyMatch:
    """A ``BodyMatch`` whose path and value the stores can both compare (``ValueError`` otherwise)."""
    if type(match) is not BodyMatch:
        raise TypeError(f"body must be a BodyMatch, not {type(match).__name__}")
    if type(match.path) is not tuple or not 1 <= len(match.path) <= MAX_PATH_KEYS:
        raise ValueError(f"a body path has 1-{MAX_PATH_KEYS} keys")
    for key in match.path:
        if type(key) is int:
            check_int(key, "a body path's index", 0, 10_000)
        elif type(key) is not str or not key.isidentifier() or len(key) > MAX_PATH_KEY_CHARS:
            raise ValueError(f"a body path's keys are names (letters, digits, _) of at most {MAX_PATH_KEY_CHARS}")
    value = match.value
    if value is not None and type(value) not in (str, int, bool):
        raise ValueError("a body path's value is a string, an integer, true, false or null")
    if type(value) is int and not -(2**53) <= value <= 2**53:
        raise ValueError("a body path's integer must be within ±2**53")
    if type(value) is str and len(value) > 1000:
        raise ValueError("a body path's string is at most 1000 characters")
    return match


def parse_body_match(text: str) -> BodyMatch:
    """``a.b.0 = value`` (the value as JSON; a bare word is a string) as a checked ``BodyMatch``."""
    left, equals, right = text.partition("=")
    if not equals:
        raise ValueError("a body path is written path = value, e.g. customer.id = 42")
    keys = tuple(int(key) if key.isdigit() else key for key in left.strip().split("."))
    raw = right.strip()
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return check_body_match(BodyMatch(keys, value))


@dataclass(frozen=True)
class SearchPlan:
    """How a search runs: the ``path`` walked in ``order``, the statuses it keeps (``None``: any), and for the
    console which filters the path's index serves and which are checked on the rows it yields."""

    query: JobQuery
    path: Path
    order: Order
    statuses: tuple[str, ...] | None
    served: tuple[str, ...]
    checked: tuple[str, ...]

    @property
    def empty(self) -> bool:
        """Nothing can match (the query's status is not one of the statuses kept)."""
        return self.statuses == ()


_SERVED = {
    Path.IDS: ("ids",),
    Path.DUE: ("status", "queue", "priority", "since_ms", "until_ms"),
    Path.ERROR: ("error_type",),
    Path.DEAD: ("status",),
    Path.LEASED: ("status",),
    Path.WAITING: ("status",),
    Path.TASK: ("task",),
    Path.SEQ: (),
}


def plan_search(query: JobQuery, order: Order = Order.NEWEST, statuses: tuple[str, ...] | None = None) -> SearchPlan:
    """The one rule that picks a search's index: the named ids, then one queue's pending jobs by when they are due,
    then an error type's index, then the dead, leased or waiting jobs' index (a status is most often the
    narrower), then a task's index, else the primary key. ``statuses`` narrows
    the query to those statuses (a bulk action's: a redrive keeps the dead). ``ValueError`` for ``due`` on anything
    but one queue's pending jobs."""
    kept = _statuses(query.status, statuses)
    if order is Order.DUE and (kept != (PENDING,) or query.queue is None or query.ids):
        raise ValueError("the due order lists one queue's pending jobs: choose status pending and a queue")
    if query.ids:
        path = Path.IDS
    elif order is Order.DUE:
        path = Path.DUE
    elif query.error_type is not None:
        path = Path.ERROR
    elif kept == (DEAD,):
        path = Path.DEAD
    elif kept == (LEASED,):
        path = Path.LEASED
    elif kept == (WAITING,):
        path = Path.WAITING
    elif query.task is not None:
        path = Path.TASK
    else:
        path = Path.SEQ
    given = [name for name, value in query.as_dict().items() if value is not None]
    if kept is not None and "status" not in given:
        given.insert(0, "status")
    served = tuple(name for name in given if name in _SERVED[path])
    checked = tuple(name for name in given if name not in served)
    return SearchPlan(query, path, order, kept, served, checked)


def _statuses(wanted: str | None, allowed: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if allowed is None:
        return None if wanted is None else (wanted,)
    return tuple(status for status in allowed if wanted is None or status == wanted)


# -- paging ----------------------------------------------------------------------------------------------------

#: Where a walk stands: after the row with this ``seq`` (and, on the ``due`` path, this ``available_at``).
Position = tuple[int, ...]


def encode_cursor(position: Position) -> str:
    """A page's cursor as text (``seq``, or ``available_at.seq`` on the due path)."""
    return ".".join(str(part) for part in position)


def decode_cursor(text: str, plan: SearchPlan) -> Position:
    """A cursor read back for ``plan`` (``ValueError`` if it is not one of its paths' cursors)."""
    parts = text.split(".")
    width = 2 if plan.path is Path.DUE else 1
    if len(parts) != width or not all(part.isdigit() and len(part) <= 19 for part in parts):
        raise ValueError(f"cursor must be {'available_at.seq' if width == 2 else 'a seq'} (digits)")
    return tuple(int(part) for part in parts)


def position_of(job: Job, plan: SearchPlan) -> Position:
    """The cursor that continues a walk just past ``job``."""
    return (job.available_at, job.seq) if plan.path is Path.DUE else (job.seq,)


@dataclass(frozen=True)
class JobPage:
    """One page of a search: its jobs; ``scanned`` the rows the path yielded for a page that is not full (``None``
    for a full one: the walk stopped at the page's end); ``capped`` when the cap on them was reached before the
    page was full (more may match further on); ``next`` the cursor of the next page (``None``: the walk has
    ended)."""

    jobs: list[Job]
    scanned: int | None
    capped: bool
    next: str | None
    plan: SearchPlan = field(repr=False)


def check_page(page: int, scan: int) -> tuple[int, int]:
    """A page's size (1-``MAX_PAGE``, or up to ``MAX_IDS`` for a bulk set) and its scan cap (at least the page)."""
    check_int(page, "page", 1, MAX_IDS)
    check_int(scan, "scan", page, 1_000_000)
    return page, scan


@dataclass(frozen=True)
class DeadGroup:
    """Dead jobs of one queue with one reason whose newest failed attempt had one error type (``None``: no attempt
    failed, as a cancelled or swept job), how many, and the newest of them."""

    queue: str
    reason: str
    error_type: str | None
    count: int
    newest_id: str
