"""What every test of the store conformance suite shares: rows built as the facade builds them, the calls a worker
makes, and the whole stored state read back through the port only, so that the same checks run on every driver.

``dump`` reads every column of every job (``list_jobs`` and ``get``), every audit row (``audit_log`` and each
job's ``history``) and ``stats``, and checks that these views agree with each other: a listing is the record
without its errors, a history is the audit log's rows of that job, ``redrives`` counts them, and every figure of
``stats`` is what the rows say. A test then states the whole state it expects with ``expect``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from asyncq.core.dependencies import Dependency
from asyncq.core.failures import ErrorText
from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.jobs import AuditEntry, Finish, Job, JobSpec, NewJob, OnConflict, OnDependencyDeadName, Ticket
from asyncq.core.jsontext import canonical_json
from asyncq.core.lifecycle import Fence
from asyncq.core.retention import RetentionRule
from asyncq.core.stats import stats_of_jobs
from asyncq.store.port.queue import JobFilter, QueueStore

#: The suite's starting time (ms since the epoch, November 2023); every call takes ``now_ms`` from the test.
T0 = 1_700_000_000_000
#: Errors a failed attempt keeps (``Finish.error``).
BOOM = ErrorText("ValueError", "boom", "Traceback (most recent call last):\nValueError: boom\n")
DOOM = ErrorText("app.Doomed", "never", "Traceback …\napp.Doomed: never\n")
#: More rows than any test makes: a listing this long is every row.
ALL = 10_000
STATUSES = ("pending", "leased", "done", "dead")


def new(
    job_id: str,
    now: int = T0,
    *,
    queue: str = "default",
    body: Any = None,
    max_attempts: int = 3,
    ttl_ms: int = 60_000,
    delay_ms: int = 0,
    priority: int = 0,
    unique_key: str | None = None,
    on_conflict: OnConflict = "return",
    after: Sequence[str | Dependency] = (),
    on_dead: OnDependencyDeadName = "dead",
    group: str | None = None,
    limit_key: str | None = None,
) -> NewJob:
    """The row the facade inserts for these values at ``now`` (the body defaults to ``{"id": job_id}``)."""
    body = {"id": job_id} if body is None else body
    spec = JobSpec(
        job_id,
        body,
        queue,
        max_attempts,
        ttl=ttl_ms / 1000,
        delay=delay_ms / 1000,
        priority=priority,
        unique_key=unique_key,
        on_conflict=on_conflict,
        after=after,
        on_dependency_dead=on_dead,
        group=group,
        limit_key=limit_key,
    )
    return spec.to_row(now)


def stored(row: NewJob, seq: int) -> Job:
    """The record a new row must be stored as: pending, no attempt made, token 0, no lease, no reason."""
    return Job(
        seq=seq,
        id=row.id,
        queue=row.payload["queue"],
        body=json.loads(row.payload["body"]),
        status="pending",
        attempts=0,
        max_attempts=row.max_attempts,
        token=0,
        available_at=row.available_at,
        deadline=row.deadline,
        owner=None,
        lease_until=None,
        reason=None,
        priority=row.payload["priority"],
        unique_key=row.payload["unique_key"],
        task=row.payload["task"],
        group=row.payload["group_name"],
        limit_key=row.payload["limit_key"],
    )


def ticket_of(job: Job) -> Ticket:
    """The ticket a claim must hand out for ``job`` as it is stored now (leased)."""
    assert job.owner is not None and job.lease_until is not None, job
    fence = Fence(job.owner, job.token, job.attempts, job.lease_until)
    body = canonical_json(job.body)
    return Ticket(job.id, job.queue, body, fence, job.deadline, job.max_attempts, job.seq, priority=job.priority)


def outcome(
    ticket: Ticket, result: str, delay_ms: int = 0, *, held: bool = True, error: ErrorText | None = None
) -> Finish:
    """A finish of ``ticket``: on the claim's snapshot (``held``, the pool's way) or decided on the row."""
    return Finish(ticket.id, ticket.fence, result, delay_ms, ticket.held if held else None, error)


async def claim(
    store: QueueStore, owner: str, now: int, *, queue: str = "default", n: int = 1, lease_ms: int = 1_000
) -> list[Ticket]:
    """Claim up to ``n`` jobs of ``queue`` (a group commit that finishes nothing)."""
    statuses, tickets, _started, _holds = await store.settle_and_claim([], now, owner, lease_ms, [(queue, n)], None)
    assert statuses == []
    return tickets


async def enqueue(store: QueueStore, *rows: NewJob) -> dict[str, Job]:
    """Insert new rows (each must be new) and return their stored records by id."""
    assert await store.enqueue(rows) == [True] * len(rows)
    jobs = {row.id: await store.get(row.id) for row in rows}
    assert all(job is not None for job in jobs.values())
    return {job_id: job for job_id, job in jobs.items() if job is not None}


@dataclass(frozen=True)
class Dump:
    """The whole stored state: every job (oldest ``seq`` first) with every column, every audit row, every
    queue's stored settings, every move on a queue (oldest first) and every retention rule."""

    jobs: dict[str, Job]
    audit: list[AuditEntry]
    queues: list[QueueSettings]
    queue_audit: list[QueueAuditEntry]
    retention: list[RetentionRule]


async def dump(store: QueueStore, now_ms: int = T0, *, deep: bool = True) -> Dump:
    """Read the whole state through the port, checking that its views agree (``deep``: each job's ``get`` and
    ``history`` too; a test of hundreds of rows reads only the listing)."""
    listed = await store.list_jobs(JobFilter(limit=ALL))
    audit = list(reversed(await store.audit_log(ALL)))
    assert [job.seq for job in listed] == sorted({job.seq for job in listed}), "list_jobs is not in seq order"
    assert [entry.seq for entry in audit] == sorted({entry.seq for entry in audit}), "audit_log is not newest first"
    jobs: dict[str, Job] = {}
    for job in listed:
        jobs[job.id] = job
        if deep:
            record = await store.get(job.id)
            assert record is not None and replace(record, errors=()) == job, "a listing differs from get()"
            own = [entry for entry in audit if entry.id == job.id]
            assert await store.history(job.id) == own
            assert record.redrives == sum(entry.action == "redrive" for entry in own)
            jobs[job.id] = record
    assert await store.stats(now_ms) == stats_of_jobs(jobs.values(), now_ms)
    moves = list(reversed(await store.queue_audit(None, ALL)))
    assert [move.seq for move in moves] == sorted({move.seq for move in moves}), "queue_audit is not newest first"
    return Dump(jobs, audit, await store.queue_settings(), moves, await store.retention_rules())


def expect(
    before: Dump,
    after: Dump,
    jobs: Mapping[str, Job | None] | None = None,
    audit: Sequence[AuditEntry] = (),
    *,
    queues: Sequence[QueueSettings] | None = None,
    queue_audit: Sequence[QueueAuditEntry] = (),
    retention: Sequence[RetentionRule] | None = None,
) -> None:
    """``after`` is ``before`` with exactly ``jobs`` changed (or added; ``None``: deleted) and ``audit`` appended,
    the queues' settings now ``queues`` (unchanged if ``None``), ``queue_audit`` appended to their moves and the
    retention rules now ``retention`` (unchanged if ``None``)."""
    wanted = {**before.jobs, **(jobs or {})}
    assert after.jobs == {job_id: job for job_id, job in wanted.items() if job is not None}
    assert after.audit == [*before.audit, *audit]
    assert after.queues == (before.queues if queues is None else list(queues))
    assert after.queue_audit == [*before.queue_audit, *queue_audit]
    assert after.retention == (before.retention if retention is None else list(retention))


class Probe(Exception):
    """Raised inside a probe transaction to roll it back."""


async def assert_no_transaction_left(store: QueueStore) -> None:
    """The store opens, writes in and rolls back a new transaction at once: nothing was left open by a refused or
    failed call (an open one would make this fail or wait)."""
    with pytest.raises(Probe):
        async with asyncio.timeout(5), store.transaction() as tx:
            assert await tx.enqueue_rows([new("probe-row")]) == [True]
            raise Probe
    assert await store.get("probe-row") is None
