"""A plain-Python model of the product queue's rows, written from ``docs/state-machine.md`` alone.

Each operation works on the model in place and raises what the queue raises (``Conflict``, ``ValueError``) before
it changes anything it must not; callers run an operation on a copy (``Model.trial``) so that a raise leaves the
model as it was, like the queue's rolled-back transaction. Nothing here imports the package's internals: only
the public ``Ticket`` (its fields) and ``Conflict``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from typing import Any, NamedTuple, TypeVar

from asyncq import Conflict, Ticket
from asyncq.core.claim_plan import Rank, claim_rank
from asyncq.core.jobs import task_of

T = TypeVar("T")
LIVE = ("pending", "leased")


def canonical(body: object) -> str:
    """The stored form of a body (sorted keys, compact, ASCII), as the docs define "the same body"."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class Spec(NamedTuple):
    """One job to enqueue."""

    id: str
    queue: str
    body: Any
    max_attempts: int
    ttl_ms: int
    delay_ms: int


@dataclass
class Row:
    """One ``asyncq_jobs`` row, its columns in table order (``astuple`` is what ``SELECT *`` gives)."""

    seq: int | None  # None until the file's value is adopted (``Model.adopt``)
    id: str
    queue: str
    body: str
    status: str
    attempts: int
    max_attempts: int
    token: int
    available_at: int
    deadline: int
    owner: str | None = None
    lease_until: int | None = None
    reason: str | None = None
    cancel_requested_at: int | None = None  # a cancel requested while it was leased (version 7)
    priority: int = 0  # version 8's column
    unique_key: str | None = None  # version 9's column
    task: str | None = None  # version 11's column
    limit_key: str | None = None  # version 14's column

    def park(self, status: str, reason: str | None, available_at: int | None = None) -> None:
        """Leave the lease: ``status``/``reason``, no owner, no lease (and ``available_at`` if given)."""
        self.status, self.reason, self.owner, self.lease_until = status, reason, None, None
        if available_at is not None:
            self.available_at = available_at


@dataclass
class Model:
    """The expected rows of ``asyncq_jobs`` (by id), ``asyncq_audit`` and the app's own table."""

    rows: dict[str, Row] = field(default_factory=dict)
    audit: list[tuple[Any, ...]] = field(default_factory=list)
    app: list[tuple[int, int]] = field(default_factory=list)
    last_seq: int = 0
    unseated: list[str] = field(default_factory=list)  # ids inserted whose seq the file has not shown yet

    def trial(self, operation: Callable[[Model], T]) -> tuple[Model, T]:
        """Run ``operation`` on a copy; the copy and the result (raises, leaving ``self`` as it was)."""
        changed = copy.deepcopy(self)
        return changed, operation(changed)

    def job_rows(self) -> list[tuple[Any, ...]]:
        return sorted(astuple(row) for row in self.rows.values())

    def adopt(self, stored: dict[str, int]) -> None:
        """Take the seq the file gave each new row: AUTOINCREMENT never reuses one, so each is above every seq
        before it, in insertion order. Gaps are allowed: SQLite spends a value on every row an ``INSERT … ON
        CONFLICT DO NOTHING`` skips, so the exact number is not the lifecycle's to promise."""
        for job_id in self.unseated:
            seq = stored[job_id]
            assert seq > self.last_seq, f"job {job_id} got seq {seq}, not above {self.last_seq}"
            self.rows[job_id].seq = self.last_seq = seq
        self.unseated.clear()

    # -- producers ------------------------------------------------------------------------------------------

    def enqueue(self, spec: Spec, now: int) -> bool:
        if not 0 <= spec.delay_ms <= spec.ttl_ms:
            raise ValueError("delay_ms out of range")
        body = canonical(spec.body)
        found = self.rows.get(spec.id)
        if found is not None:
            if (found.queue, found.body) != (spec.queue, body):
                raise Conflict(spec.id)
            return False
        available_at, deadline = now + spec.delay_ms, now + spec.ttl_ms
        self.rows[spec.id] = Row(
            None, spec.id, spec.queue, body, "pending", 0, spec.max_attempts, 0, available_at, deadline,
            task=task_of(spec.body),
        )  # fmt: skip
        self.unseated.append(spec.id)
        return True

    def enqueue_many(self, specs: list[Spec], now: int) -> list[bool]:
        for spec in specs:  # every spec is checked before any row is written
            if not 0 <= spec.delay_ms <= spec.ttl_ms:
                raise ValueError("delay_ms out of range")
        return [self.enqueue(spec, now) for spec in specs]

    # -- workers --------------------------------------------------------------------------------------------

    def sweep(self, now: int) -> None:
        """Park every unclaimable live row: the deadline first, then used-up attempts (expired leases only)."""
        for row in self.rows.values():
            if row.status in LIVE and row.deadline <= now and _lease_gone(row, now):
                row.park("dead", "deadline")
        for row in self.rows.values():
            if row.status in LIVE and row.attempts >= row.max_attempts and _lease_gone(row, now):
                row.park("dead", "exhausted")
        for row in self.rows.values():  # a cancel was requested and nobody holds the job any more
            if row.status in LIVE and row.cancel_requested_at is not None and _lease_gone(row, now):
                row.park("dead", "cancelled", now)

    def claim(self, owner: str, queue: str, limit: int, lease_ms: int, now: int) -> list[Row]:
        self.sweep(now)
        ready = [row for row in self.rows.values() if row.queue == queue and _ready(row, now)]
        taken = sorted(ready, key=_rank)[:limit]
        for row in taken:
            row.status, row.reason, row.owner = "leased", None, owner
            row.attempts += 1
            row.token += 1
            row.lease_until = min(now + lease_ms, row.deadline)
        return [copy.copy(row) for row in taken]

    def holds(self, ticket: Ticket, now: int, *, snapshot: bool) -> Row | None:
        """The row ``ticket`` still holds a live lease on, or ``None``. ``snapshot``: a finish, which is decided
        on the claim's copy of the row and compare-and-sets every column of it (seq, deadline, max_attempts)."""
        row = self.rows.get(ticket.id)
        fence = ticket.fence
        if row is None or row.status != "leased":
            return None
        held = (row.owner, row.token, row.attempts, row.lease_until) == (
            fence.owner,
            fence.token,
            fence.attempt,
            fence.lease_until,
        )
        if snapshot:
            held = held and (row.seq, row.deadline, row.max_attempts) == (
                ticket.seq,
                ticket.deadline,
                ticket.max_attempts,
            )
        return row if held and now < fence.lease_until and now < row.deadline else None

    def finish(self, ticket: Ticket, outcome: str, delay_ms: int, now: int) -> str | None:
        row = self.holds(ticket, now, snapshot=True)
        if row is None:
            return None
        if outcome == "ok":
            row.park("done", None, now)
        elif outcome == "permanent":
            row.park("dead", "permanent", now)
        elif row.attempts >= row.max_attempts:
            row.park("dead", "exhausted", now)
        elif now + delay_ms >= row.deadline:
            row.park("dead", "deadline", now)
        else:
            row.park("pending", "retry", now + delay_ms)
        return row.status

    def extend(self, ticket: Ticket, lease_ms: int, now: int) -> int | None:
        row = self.holds(ticket, now, snapshot=False)
        if row is None:
            return None
        row.lease_until = min(now + lease_ms, row.deadline)
        return row.lease_until

    def release(self, ticket: Ticket, now: int) -> bool:
        row = self.holds(ticket, now, snapshot=False)
        if row is None:
            return False
        row.park("pending", None, now)
        row.attempts -= 1
        return True

    # -- operators ------------------------------------------------------------------------------------------

    def redrive(self, job_id: str, note: str, ttl_ms: int, now: int) -> bool:
        row = self.rows.get(job_id)
        if row is None or row.status != "dead":
            raise ValueError(f"{job_id} is not dead")
        self.audit.append((len(self.audit) + 1, job_id, row.token, now, note, "redrive", None))
        row.park("pending", None, now)
        row.attempts, row.deadline, row.cancel_requested_at = 0, now + ttl_ms, None
        return True

    def cancel(self, job_id: str, note: str, now: int) -> str:
        """A pending job (or one whose lease expired) ends dead at once; a live lease gets a request on its row
        (once); an ended job is too late."""
        row = self.rows.get(job_id)
        if row is None:
            raise ValueError(f"{job_id} is missing")
        if row.status in ("done", "dead"):
            return "too_late"
        if row.status == "leased" and not _lease_gone(row, now):
            if row.cancel_requested_at is None:
                self.audit.append((len(self.audit) + 1, job_id, row.token, now, note, "cancel_request", "cancelled"))
                row.cancel_requested_at = now
            return "requested"
        self.audit.append((len(self.audit) + 1, job_id, row.token, now, note, "cancel", "cancelled"))
        row.park("dead", "cancelled", now)
        return "cancelled"


def _rank(row: Row) -> Rank:
    """The claim order (``core.claim_plan.claim_rank``; the model sets no ``max_wait``, so none is late)."""
    return claim_rank(row.priority, row.available_at, _seq(row), False)


def _seq(row: Row) -> int:
    assert row.seq is not None, "every row's seq is adopted after the step that inserted it"
    return row.seq


def _lease_gone(row: Row, now: int) -> bool:
    return row.status == "pending" or (row.lease_until is not None and row.lease_until <= now)


def _ready(row: Row, now: int) -> bool:
    if row.status == "pending":
        return row.available_at <= now
    return row.status == "leased" and row.lease_until is not None and row.lease_until <= now
