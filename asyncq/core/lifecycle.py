"""The job lifecycle: states, every allowed transition, and the pure decisions behind them.

This module is the one place that says how a job moves. ``docs/state-machine.md`` draws the same table
and ``tests/test_state_machine.py`` checks that the two agree and that the engine never makes a move
that is not listed here. The SQL that carries the decisions out is each driver's (``asyncq.store.sqlite.statements``,
``asyncq.store.postgres.statements``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, NamedTuple


class Status(StrEnum):
    """Where a job is in its life. Stored as these exact strings."""

    PENDING = "pending"  # waiting: enqueued, retried, redriven or released (enters by enqueue, finish, redrive)
    LEASED = "leased"  # claimed under a lease: a worker holds its fence (enters by claim; leaves by finish/sweep)
    DONE = "done"  # finished ok: final (leaves only by prune)
    DEAD = "dead"  # parked with a reason: leaves only by an operator's redrive (or prune)
    WAITING = "waiting"  # waits for its dependencies (or its group, a callback): no claim sees it (enters by enqueue,
    # redrive; leaves when its last dependency is met, or ends dead: core.dependencies)


class Outcome(StrEnum):
    """What a worker reports for an attempt."""

    OK = "ok"
    RETRY = "retry"
    PERMANENT = "permanent"
    CANCEL = "cancel"  # the holder ends a job whose cancel was requested (or that it gives up on): dead, cancelled


#: An outcome as its string, for callers that pass ``"ok"`` rather than ``Outcome.OK`` (mypy checks the spelling).
OutcomeName = Literal["ok", "retry", "permanent", "cancel"]


class Reason(StrEnum):
    """Why a job is where it is. ``retry`` marks a pending job that failed before; the others explain ``dead``."""

    RETRY = "retry"
    DEADLINE = "deadline"
    EXHAUSTED = "exhausted"
    PERMANENT = "permanent"
    CANCELLED = "cancelled"
    DEPENDENCY = "dependency"  # a dependency it waited for ended dead, and its edge's policy is ``dead``


# The members' values under short names, as the engine and the labs use them: plain ``str``s, equal to the members
# and to the stored strings. Plain because sqlite3 binds an exact ``str`` directly and a ``str`` subclass only after
# looking for an adapter (0.7 µs a parameter, measured; a group commit binds two a job).
PENDING, LEASED, DONE, DEAD, WAITING = (status.value for status in Status)
STATUSES = tuple(Status)
OK: Final[OutcomeName] = "ok"
RETRY: Final[OutcomeName] = "retry"
PERMANENT: Final[OutcomeName] = "permanent"
CANCEL: Final[OutcomeName] = "cancel"
OUTCOMES = tuple(Outcome)
#: The outcomes of an attempt the lease lab's contract knows (it has no cancel).
LAB_OUTCOMES = (Outcome.OK, Outcome.RETRY, Outcome.PERMANENT)
REASON_RETRY, REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT, REASON_CANCELLED, REASON_DEPENDENCY = (
    r.value for r in Reason
)
#: The statuses in which a job is active and so holds its unique key (``JobSpec.unique_key``): at most one job of a
#: queue in these holds a key at once (each store's partial unique index, over exactly these). A delayed job is
#: pending, so it holds its key from its enqueue; a job waiting for its dependencies holds it too (it will run); a
#: retry, a release (leased -> pending) or a dependency met (waiting -> pending) stays inside them and keeps the key it
#: holds; once the job ends (done, dead) the key is free, and a redrive (dead -> pending or waiting) must take it again.
UNIQUE_WHILE: Final[tuple[str, ...]] = (PENDING, LEASED, WAITING)
#: The statuses of a job that has not ended (it may still run): what a dependant, a group or retention looks at.
LIVE: Final[tuple[str, ...]] = (WAITING, PENDING, LEASED)
DEAD_REASONS = (REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT, REASON_CANCELLED, REASON_DEPENDENCY)


@dataclass(frozen=True)
class Transition:
    """One allowed move: from ``source`` to ``target``, leaving ``reason`` on the row, made by ``actor``."""

    source: str
    target: str
    reason: str | None
    actor: str


TRANSITIONS: tuple[Transition, ...] = (
    Transition(PENDING, LEASED, None, "claim"),
    Transition(LEASED, LEASED, None, "claim"),  # an expired lease is taken over: new token, new owner
    Transition(LEASED, LEASED, None, "extend"),  # the holder renews its lease (product facade only)
    Transition(LEASED, DONE, None, "finish"),
    Transition(LEASED, PENDING, REASON_RETRY, "finish"),
    Transition(LEASED, DEAD, REASON_EXHAUSTED, "finish"),
    Transition(LEASED, DEAD, REASON_DEADLINE, "finish"),
    Transition(LEASED, DEAD, REASON_PERMANENT, "finish"),
    Transition(LEASED, DEAD, REASON_CANCELLED, "finish"),  # the holder ends a job whose cancel was requested
    Transition(PENDING, DEAD, REASON_DEADLINE, "sweep"),
    Transition(PENDING, DEAD, REASON_EXHAUSTED, "sweep"),
    Transition(LEASED, DEAD, REASON_DEADLINE, "sweep"),  # only once the lease has expired
    Transition(LEASED, DEAD, REASON_EXHAUSTED, "sweep"),  # only once the lease has expired
    Transition(PENDING, DEAD, REASON_CANCELLED, "sweep"),  # a cancel was requested, then it was retried or released
    Transition(LEASED, DEAD, REASON_CANCELLED, "sweep"),  # a cancel was requested, then the lease expired
    Transition(DEAD, PENDING, None, "redrive"),
    Transition(PENDING, DEAD, REASON_CANCELLED, "cancel"),  # product facade only, audited
    Transition(LEASED, DEAD, REASON_CANCELLED, "cancel"),  # its lease had expired: nobody holds it
    Transition(LEASED, LEASED, None, "cancel"),  # a live lease: a cancel request stored on the row for its holder
    Transition(LEASED, PENDING, None, "release"),  # product pool only: a claimed job it never started
    # Dependencies and groups (product only: ``core.dependencies``). ``dependency``: moved in the transaction that
    # ended one of its dependencies (a finish, the sweep, a cancel) or completed its group (a callback).
    Transition(WAITING, PENDING, None, "dependency"),  # its last dependency met (or its group completed)
    Transition(WAITING, DEAD, REASON_DEPENDENCY, "dependency"),  # a dependency ended dead, its edge's policy "dead"
    Transition(WAITING, DEAD, REASON_DEADLINE, "sweep"),  # its deadline passed while it waited
    Transition(WAITING, DEAD, REASON_CANCELLED, "cancel"),  # nobody holds a waiting job: it ends at once
    Transition(DEAD, WAITING, None, "redrive"),  # redriven while a dependency (or its group) is still unmet
)


class Fence(NamedTuple):
    """What a worker holds after a claim; a finish or renewal lands only if all of it still matches.

    A named tuple, like the other values built per job (see ``JobState``)."""

    owner: str
    token: int
    attempt: int
    lease_until: int


class Renewal(NamedTuple):
    """A renewed lease: the new fence, and whether a cancel of the job was requested (its holder ends it)."""

    fence: Fence
    cancel_requested: bool


class JobState(NamedTuple):
    """The lifecycle columns of one stored job, as read inside the write transaction.

    Internal values made once per job per transaction are named tuples: a frozen dataclass costs 5x as
    much to build (≈ 0.6 µs for seven fields), and a group commit builds several per job."""

    status: str
    attempts: int
    max_attempts: int
    token: int
    owner: str | None
    lease_until: int | None
    deadline: int


class Change(NamedTuple):
    """The row's new status, reason and ``available_at`` after a finish."""

    status: str
    reason: str | None
    available_at: int


def holds_lease(job: JobState, fence: Fence, now_ms: int) -> bool:
    """True if ``fence`` is the current, unexpired lease on ``job`` (and the deadline has not passed)."""
    return (
        job.status == LEASED
        and job.owner == fence.owner
        and job.token == fence.token
        and job.attempts == fence.attempt
        and job.lease_until == fence.lease_until
        and now_ms < fence.lease_until
        and now_ms < job.deadline
    )


def decide_finish(job: JobState, fence: Fence, outcome: str, now_ms: int, delay_ms: int) -> Change | None:
    """The change a finish makes, or ``None`` when the ticket is stale (nothing may change)."""
    if not holds_lease(job, fence, now_ms):
        return None
    if outcome == OK:
        return Change(DONE, None, now_ms)
    if outcome == PERMANENT:
        return Change(DEAD, REASON_PERMANENT, now_ms)
    if outcome == CANCEL:
        return Change(DEAD, REASON_CANCELLED, now_ms)
    if job.attempts >= job.max_attempts:
        return Change(DEAD, REASON_EXHAUSTED, now_ms)
    if now_ms + delay_ms >= job.deadline:
        return Change(DEAD, REASON_DEADLINE, now_ms)
    return Change(PENDING, REASON_RETRY, now_ms + delay_ms)


class CancelState(StrEnum):
    """What ``Queue.cancel`` did (``decide_cancel``)."""

    CANCELLED = "cancelled"  # ended dead (reason cancelled) at once: it was pending, or its lease had expired
    REQUESTED = "requested"  # leased under a live lease: a cancel request is stored on its row for its holder
    TOO_LATE = "too_late"  # it had ended already (done or dead): nothing changes


def decide_cancel(job: JobState, now_ms: int) -> CancelState:
    """What a cancel does to ``job`` as read in the cancel's own transaction: the one rule, every store runs it.

    A request, once stored, is honoured by whoever moves the job next: its holder's renewal sees it and the holder
    finishes the job with ``CANCEL``; if the holder finishes first, its finish stands (``ok`` is ``done``), except
    that a job retried or released with a request on its row, or whose lease expires with one, is never run again:
    the next claim's sweep ends it dead (``cancelled``). A redrive clears the request."""
    if job.status in (PENDING, WAITING):
        return CancelState.CANCELLED
    if job.status == LEASED:
        expired = job.lease_until is None or job.lease_until <= now_ms
        return CancelState.CANCELLED if expired else CancelState.REQUESTED
    return CancelState.TOO_LATE


def status_after_cancel(decided: CancelState, status: str) -> str:
    """The job's status once a cancel decided ``decided`` on a row in ``status`` has run."""
    return {CancelState.CANCELLED: DEAD, CancelState.REQUESTED: LEASED}.get(decided, status)
