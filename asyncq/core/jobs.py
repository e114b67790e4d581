"""What a product queue stores and hands out: job specs, tickets and job records, with their checks.

The value rules are the lab's (``asyncq.core.values``); only the ranges are wider, because product jobs
live longer than the lab's one-minute budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

from asyncq.core.dependencies import Dependency, OnDependencyDead, check_after
from asyncq.core.failures import ErrorText
from asyncq.core.flow_limits import Hold
from asyncq.core.groups import check_group_name
from asyncq.core.jsontext import JSON, JSONInput, canonical_json
from asyncq.core.lifecycle import CancelState, Fence
from asyncq.core.limits import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    DEFAULT_TTL_MS,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_LEASE_MS,
    MAX_TTL_MS,
)
from asyncq.core.values import (
    Duration,
    check_identifier,
    check_int,
    check_limit_key,
    check_on_conflict,
    check_priority,
    check_unique_key,
    duration_ms,
    is_task_name,
)

#: What a second job with a unique key held by an active job does (``asyncq.core.values.ON_CONFLICT``).
OnConflict = Literal["return", "raise"]
#: What a job does when a job it waits for ends dead (``core.dependencies.OnDependencyDead``).
OnDependencyDeadName = Literal["dead", "run", "wait"]

#: What an enqueue answers for each job: ``True`` it was inserted; ``False`` the id exists with the same payload
#: (its row is kept whole); a ``str``: nothing was inserted because another active job of the queue holds the
#: job's unique key, and this is that job's id.
Enqueued = bool | str


class NewJob(NamedTuple):
    """A job to insert: ``payload`` holds the layout's payload columns by name."""

    id: str
    payload: dict[str, Any]
    max_attempts: int
    available_at: int
    deadline: int
    #: With a unique key held by another active job: raise ``UniqueConflict`` (``True``) or answer with that
    #: job's id (``False``: ``on_conflict="return"``).
    raise_on_unique: bool = False
    #: The jobs it waits for, ``(id, policy)`` each (``core.dependencies``); its group is ``payload["group_name"]``.
    after: tuple[tuple[str, str], ...] = ()
    #: Whether it joins a graph (dependencies or a group): only then does an enqueue run more than its insert.
    linked: bool = False
    #: When it was enqueued (its ``available_at`` less its delay): a graph's rows are dated by it.
    enqueued_at: int = 0


class Claimed(NamedTuple):
    """A claimed job: its payload columns and the fence that proves the lease."""

    id: str
    payload: dict[str, Any]
    fence: Fence
    deadline: int


class Held(NamedTuple):
    """The rest of a leased row as its claim returned it, for a finish decided without reading the row:
    while the fence holds, nothing else in the row that a decision reads can change (a renewal moves only
    ``lease_until``, which the fence carries)."""

    seq: int
    max_attempts: int
    deadline: int


class StoredResult(NamedTuple):
    """What a task returned, to keep with its job when the attempt's finish lands as ``done``: its JSON text and
    how long to keep it (ms from the finish; ``prune`` removes it after that)."""

    json: str
    keep_ms: int


class Finish(NamedTuple):
    """One ticket's outcome: ``delay_ms`` matters only for ``retry``. With ``held``, the finish is decided
    on the claim's snapshot instead of a read of the row (the statement still checks all of it)."""

    id: str
    fence: Fence
    outcome: str
    delay_ms: int = 0
    held: Held | None = None
    #: Why the attempt failed (``retry`` or ``permanent``): kept with the job when the finish lands.
    error: ErrorText | None = None
    #: ``False`` for a job claimed ahead whose attempt is not counted yet: the finish counts it.
    counted: bool = True
    #: What the handler returned, kept with the job in the finish's transaction if it lands as ``done``.
    result: StoredResult | None = None


__all__ = [
    "DEFAULT_LEASE_MS",
    "DEFAULT_QUEUE",
    "DEFAULT_TTL_MS",
    "MAX_ATTEMPTS",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_LEASE_MS",
    "MAX_TTL_MS",
    "AttemptError",
    "AuditEntry",
    "Claimed",
    "Enqueued",
    "Finish",
    "Held",
    "Job",
    "JobSpec",
    "NewJob",
    "OnConflict",
    "Settled",
    "StoredResult",
    "Ticket",
    "body_text",
]


def body_text(body: object, max_bytes: int = MAX_BODY_BYTES) -> str:
    """The stored form of a body: its canonical JSON; ``ValueError`` if not JSON or over ``max_bytes``.

    Two bodies are the same job exactly when their canonical forms are equal."""
    try:
        text = canonical_json(body)
    except ValueError as error:
        raise ValueError(f"body is {error}") from None
    if len(text) > max_bytes:  # ASCII-escaped, so characters are bytes
        raise ValueError(f"body is larger than {max_bytes} bytes as JSON")
    return text


def task_of(body: object) -> str | None:
    """The task a job's body names, stored in its row's ``task`` column: a task's body is an object with ``"task"``,
    a task name (``values.check_task_name``), and ``"args"``, an object (``{"task": name, "args": {…}}``, with a
    deferral's ``"trace"`` beside them); any other body names none (``None``)."""
    if type(body) is not dict:
        return None
    name, args = body.get("task"), body.get("args")
    if type(name) is not str or type(args) is not dict or not is_task_name(name):
        return None
    return name


class EnqueueOptions(TypedDict, total=False):
    """The options of one enqueue after its id and body, by keyword (``JobSpec``'s fields say what each is)."""

    queue: str
    max_attempts: int
    ttl: Duration | None
    delay: Duration | None
    priority: int
    unique_key: str | None
    on_conflict: OnConflict
    after: Sequence[str | Dependency]
    on_dependency_dead: OnDependencyDeadName
    group: str | None
    limit_key: str | None


@dataclass(frozen=True, init=False)
class JobSpec:
    """A job to enqueue. ``id`` is its idempotency key: the same id and body again is a no-op.

    ``ttl`` (from enqueue to its deadline, default a day) and ``delay`` (before its first attempt) are seconds or a
    ``timedelta``; ``priority`` (-100 … 100, default 0) orders its queue: higher first (``docs/flow-control.md``).
    The priority is part of the job: the same id again with another priority is a ``Conflict``.

    ``unique_key`` (1-200 printable characters): while a job of the same queue with this key is active (pending,
    delayed included, or leased), another is not inserted: the enqueue answers with the active job's id, or raises
    ``UniqueConflict`` with ``on_conflict="raise"``; once that job ends (done or dead) the key is free. The key is
    part of the job as the priority is (the same id with another key is a ``Conflict``); the id stays the
    idempotency key forever (``docs/flow-control.md``).

    ``after``: ids of jobs (or ``Dependency`` values) it waits for; it is stored ``waiting`` until each has ended
    done (``on_dependency_dead`` says what a dependency that ends dead does: ``dead``, ``run`` or ``wait``). ``group``:
    the group it is a member of (``Queue.seal_group``). Both are ``docs/dependencies.md``'s.

    ``limit_key`` (1-200 printable characters: a tenant, an account) names the jobs a queue's per-key concurrency
    limit bounds together (``Queue.set_limits``); it is part of the job too."""

    id: str
    body: JSONInput
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    # Keyword-only: a positional millisecond value written for the older fields fails loudly.
    ttl: Duration | None = field(default=None, kw_only=True)
    delay: Duration | None = field(default=None, kw_only=True)
    priority: int = field(default=0, kw_only=True)
    unique_key: str | None = field(default=None, kw_only=True)
    on_conflict: OnConflict = field(default="return", kw_only=True)
    after: Sequence[str | Dependency] = field(default=(), kw_only=True)
    on_dependency_dead: OnDependencyDeadName = field(default=OnDependencyDead.DEAD.value, kw_only=True)
    group: str | None = field(default=None, kw_only=True)
    limit_key: str | None = field(default=None, kw_only=True)

    def __init__(
        self,
        id: str,
        body: JSONInput,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        *,
        ttl: Duration | None = None,
        delay: Duration | None = None,
        priority: int = 0,
        unique_key: str | None = None,
        on_conflict: OnConflict = "return",
        after: Sequence[str | Dependency] = (),
        on_dependency_dead: OnDependencyDeadName = OnDependencyDead.DEAD.value,
        group: str | None = None,
        limit_key: str | None = None,
    ) -> None:
        # The fields above, set in one update of the instance's dict: the frozen dataclass's own ``__init__`` calls
        # ``object.__setattr__`` once a field, 13 of them (0.3 µs of every job enqueued, measured).
        self.__dict__.update(
            id=id, body=body, queue=queue, max_attempts=max_attempts, ttl=ttl, delay=delay, priority=priority,
            unique_key=unique_key, on_conflict=on_conflict, after=after, on_dependency_dead=on_dependency_dead,
            group=group, limit_key=limit_key,
        )  # fmt: skip

    def to_row(self, now_ms: int, max_body_bytes: int = MAX_BODY_BYTES) -> NewJob:
        """Validate every field and build the row inserted at ``now_ms``."""
        check_identifier(self.id, "id")
        check_identifier(self.queue, "queue")
        check_int(self.max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        # Most jobs take the defaults below: a call for each check only when a field is not its default.
        if type(self.priority) is not int or self.priority != 0:
            check_priority(self.priority)
        if self.unique_key is not None or self.limit_key is not None:
            check_unique_key(self.unique_key)
            check_limit_key(self.limit_key)
        raise_on_unique = self.on_conflict != "return" and check_on_conflict(self.on_conflict) == "raise"
        ttl_ms = DEFAULT_TTL_MS if self.ttl is None else duration_ms(self.ttl, "ttl", DEFAULT_TTL_MS, 1, MAX_TTL_MS)
        delay_ms = 0 if self.delay is None else duration_ms(self.delay, "delay", 0, 0, ttl_ms)
        body = body_text(self.body, max_body_bytes)
        after, group = (
            self._graph() if self.after or self.group is not None or self.on_dependency_dead != "dead" else _NO_GRAPH
        )
        # tuple.__new__: a named tuple's constructor is a Python call (by keyword, three times as costly again).
        payload = {
            "queue": self.queue, "body": body, "priority": self.priority, "unique_key": self.unique_key,
            "task": task_of(self.body) if type(self.body) is dict and "task" in self.body else None,
            "group_name": group, "limit_key": self.limit_key,
        }  # fmt: skip
        linked = bool(after) or group is not None
        row = (
            self.id, payload, self.max_attempts, now_ms + delay_ms, now_ms + ttl_ms, raise_on_unique, after, linked,
            now_ms,
        )  # fmt: skip
        return tuple.__new__(NewJob, row)

    def _graph(self) -> tuple[tuple[tuple[str, str], ...], str | None]:
        """The checked ``after`` and ``group`` (``docs/dependencies.md``)."""
        after = check_after(self.after, self.on_dependency_dead)
        if any(job_id == self.id for job_id, _policy in after):
            raise ValueError(f"job {self.id!r} cannot wait for itself")
        return after, None if self.group is None else check_group_name(self.group)


_NO_GRAPH: tuple[tuple[tuple[str, str], ...], None] = ((), None)  # a job in no graph: nothing to check

# The C scanner behind ``json.loads``, called directly: ``json.loads`` passes through three Python frames and two
# whitespace matches first (0.87 against 0.16 µs for a small body).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_stored(text: str) -> Any:
    """A body as stored (canonical JSON text) decoded; anything the scanner does not take whole (whitespace around
    it, a text that is not JSON) goes through ``json.loads``, which decodes it or raises as it always would."""
    try:
        value, end = _scan_json(text, 0)
    except (StopIteration, TypeError, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class _DecodedOnce:
    """``Ticket.body``: decoded on first read and kept in the instance's ``__dict__``, where later reads find it
    before this (non-data) descriptor. ``functools.cached_property`` does the same but takes a lock on every
    first read on Python 3.11 (1.2 µs of a job's 1.9)."""

    def __get__(self, ticket: Ticket | None, owner: type[Ticket]) -> Any:
        if ticket is None:
            return self
        body = ticket.__dict__["body"] = decode_stored(ticket.body_json)
        return body


def _check_type(value: object, name: str, kind: type) -> None:
    if type(value) is not kind:  # exact: a bool is not an int here, a str subclass is not a str
        raise TypeError(f"{name} must be {kind.__name__}, not {type(value).__name__}")


@dataclass(frozen=True)
class Ticket:
    """A claimed job and the fence proving the lease; hand it back to ``finish`` or ``extend``.

    ``body_json`` is the body as stored (canonical JSON text); ``body`` decodes it on first use. ``seq``
    (the row's) and ``max_attempts`` let a finish decide without reading the row again."""

    id: str
    queue: str
    body_json: str = field(repr=False)
    fence: Fence
    deadline: int
    max_attempts: int
    seq: int = field(repr=False)
    #: ``False`` while a job claimed ahead (into a pool's buffer) has not been started: its attempt is counted
    #: when a handler starts it, so a worker killed with jobs in its buffer spends none of their attempts.
    counted: bool = True
    #: The job's priority (-100 … 100, higher claimed first).
    priority: int = 0

    def __post_init__(self) -> None:
        # A ticket built by hand (a test, ``dataclasses.replace``) is checked before any statement binds it; the
        # store's own tickets are built from its rows by ``from_row`` and ``started``, which skip ``__init__``.
        for name in ("id", "queue", "body_json"):
            _check_type(getattr(self, name), f"ticket.{name}", str)
        if type(self.fence) is not Fence:
            raise TypeError(f"ticket.fence must be a Fence, not {type(self.fence).__name__}")
        _check_type(self.fence.owner, "ticket.fence.owner", str)
        for name in ("token", "attempt", "lease_until"):
            _check_type(getattr(self.fence, name), f"ticket.fence.{name}", int)
        for name in ("deadline", "max_attempts", "seq"):
            _check_type(getattr(self, name), f"ticket.{name}", int)
        _check_type(self.counted, "ticket.counted", bool)
        _check_type(self.priority, "ticket.priority", int)

    if TYPE_CHECKING:

        @property
        def body(self) -> JSON:
            """The job's body, decoded from ``body_json`` on first use."""

    else:
        body = _DecodedOnce()

    @property
    def token(self) -> int:
        return self.fence.token

    @property
    def attempt(self) -> int:
        """The attempt this is (a job claimed ahead: the one it becomes when started)."""
        return self.fence.attempt if self.counted else self.fence.attempt + 1

    @property
    def lease_until(self) -> int:
        return self.fence.lease_until

    @classmethod
    def from_row(cls, row: tuple[Any, ...], counted: bool, queue: str, owner: str, lease_end: int) -> Ticket:
        """The ticket of a row a product claim statement returned (``seq, id, body, priority, token, attempts,
        deadline, max_attempts``, then the claim's rank, not the ticket's), built in one step: a group commit builds
        one per claimed job. The claim set the rest, so they are not read back: its ``queue``, its ``owner``, and
        the lease's end, ``lease_end`` (the claim's now plus the lease) or the job's deadline if that comes first."""
        seq, job_id, body_json, priority, token, attempts, deadline, max_attempts = row[:8]
        # The frozen dataclass's __init__ sets each field through object.__setattr__ (3.2 µs here); filling
        # the instance's __dict__ at once gives the same object in 1.5 µs.
        ticket = object.__new__(cls)
        lease_until = lease_end if lease_end < deadline else deadline
        ticket.__dict__.update(
            id=job_id,
            queue=queue,
            body_json=body_json,
            fence=tuple.__new__(Fence, (owner, token, attempts, lease_until)),  # no Python call, unlike Fence(…)
            deadline=deadline,
            max_attempts=max_attempts,
            seq=seq,
            counted=counted,
            priority=priority,
        )
        return ticket

    def started(self) -> Ticket:
        """This ticket of a job claimed ahead once its attempt is counted (the fence's attempt one more). A copy of
        the instance's fields (and decoded body), without the frozen dataclass's ``__init__``: ``replace`` cost 3 µs."""
        owner, token, attempt, lease_until = self.fence
        ticket = object.__new__(Ticket)
        ticket.__dict__.update(self.__dict__)
        ticket.__dict__.update(fence=tuple.__new__(Fence, (owner, token, attempt + 1, lease_until)), counted=True)
        return ticket

    @property
    def held(self) -> Held:
        """The claim's snapshot a finish is decided on (see ``Held``)."""
        return tuple.__new__(Held, (self.seq, self.max_attempts, self.deadline))


class Settled(NamedTuple):
    """What a pool's group commit did: the new status of each finish (``None``: stale), the tickets claimed
    (those that start at once first, then those claimed ahead), for each started job claimed ahead whether
    its attempt was counted (``False``: its lease is no longer held), and the queues whose limits let the claim take
    nothing (``holds``: until when, and whether only time frees them; ``core.flow_limits``)."""

    statuses: list[str | None]
    tickets: list[Ticket]
    started: list[bool]
    holds: tuple[Hold, ...] = ()


@dataclass(frozen=True)
class Job:
    """One stored job, as ``Queue.get`` reads it."""

    seq: int
    id: str
    queue: str
    body: JSON
    status: str
    attempts: int
    max_attempts: int
    token: int
    available_at: int
    deadline: int
    owner: str | None
    lease_until: int | None
    reason: str | None
    #: How many times an operator redrove it (audit rows with action ``redrive``).
    redrives: int = 0
    #: The error of each failed attempt, oldest first (``Queue.get`` reads them; listings leave them out).
    errors: tuple[AttemptError, ...] = ()
    #: A task's stored result as JSON text (``Queue.get`` reads it), ``None`` if none is kept (or it was pruned).
    result_json: str | None = None
    #: Its priority (-100 … 100, higher claimed first).
    priority: int = 0
    #: When a cancel was requested while it was leased (``Queue.cancel``), ``None`` if none was (or since a redrive).
    cancel_requested_at: int | None = None
    #: Its unique key (``JobSpec.unique_key``), held while it is active; ``None`` if it has none.
    unique_key: str | None = None
    #: The task its body names (``{"task": name, "args": {…}}``: ``task_of``), set when it was enqueued; ``None`` for
    #: any other body (and for jobs enqueued before the store had the column).
    task: str | None = None
    #: The group it is a member of (``JobSpec.group``), ``None`` if none.
    group: str | None = None
    #: How many of its dependencies (and its group, for a callback) it still waits for (``docs/dependencies.md``).
    waits: int = 0
    #: Its limit key (``JobSpec.limit_key``): the jobs a per-key concurrency limit bounds together; ``None``: none.
    limit_key: str | None = None

    @property
    def result(self) -> JSON:
        """The stored result, decoded (``None`` also when there is none: see ``result_json``)."""
        return None if self.result_json is None else decode_stored(self.result_json)

    @property
    def last_error(self) -> AttemptError | None:
        """The newest failed attempt's error, if any."""
        return self.errors[-1] if self.errors else None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Job:
        """A job from its columns as the stores list them (the fields up to ``redrives`` in declaration order, then
        ``priority``, ``cancel_requested_at``, ``unique_key``, ``task``, ``group``, ``waits`` and ``limit_key``), the
        body as its stored JSON text."""
        *values, redrives, priority, cancel_requested_at, unique_key, task, group, waits, limit_key = row
        values[3] = json.loads(values[3])
        # mypy cannot tell that ``values`` stops before the keywords' fields (it is the 13 columns before redrives)
        return cls(  # type: ignore[misc]
            *values,
            redrives=redrives,
            priority=priority,
            cancel_requested_at=cancel_requested_at,
            unique_key=unique_key,
            task=task,
            group=group,
            waits=waits,
            limit_key=limit_key,
        )


@dataclass(frozen=True)
class AttemptError:
    """Why one attempt failed: the exception's type and message, and its traceback cut to a few KiB."""

    attempt: int
    at_ms: int
    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class CancelOutcome:
    """What ``Queue.cancel`` did: ``state`` is ``cancelled`` (ended dead at once), ``requested`` (its holder
    ends it at its next renewal) or ``too_late`` (it had ended); ``audit`` is the audit row written (``None`` for
    ``too_late``, or a request made again), ``status`` the job's status after the call."""

    id: str
    state: CancelState
    status: str
    audit: AuditEntry | None


@dataclass(frozen=True)
class AuditEntry:
    """One operator action on a job, as the audit log keeps it: ``redrive``, ``cancel``, ``cancel_request``,
    ``delete`` or ``priority``, the token the job had, when (``at_ms``), the operator's note, for a cancel the reason
    it was parked with, and for a console's action the operator audit entry that made it (``op_seq``)."""

    seq: int
    id: str
    action: str
    token: int
    at_ms: int
    note: str
    reason: str | None
    op_seq: int | None = None
