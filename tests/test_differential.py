"""One random history run through the lease lab (``asyncq.lab.lease``) and through the async ``Queue``.

Both run the same engine on different tables; this test checks that nothing between them (validation, the
adapters, the product's scope and JSON body) changes the lifecycle. After every step the return values, the
lifecycle columns of ``jobs`` / ``asyncq_jobs`` (ordered by seq) and the audit rows must be equal.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lab_order import orders_agree

from asyncq.core.jobs import Ticket
from asyncq.core.values import TIME_MAX_MS
from asyncq.errors import Conflict
from asyncq.lab import lease
from asyncq.queue import Queue

pytestmark = pytest.mark.timeout(120)

JOB_IDS = ("j0", "j1", "j2", "j3", "j4", "j5")
OWNERS = ("w1", "w2")
NOTES = ("ops", "fixed")
OUTCOMES = ("ok", "retry", "permanent")
LIFECYCLE = "id, status, attempts, max_attempts, token, available_at, deadline, owner, lease_until, reason"

Step = tuple[Any, ...]

# Every value is valid for both: the lab's ranges are the narrower ones.
enqueue_steps = st.tuples(
    st.just("enqueue"),
    st.sampled_from(JOB_IDS),
    st.integers(1, 3),  # qty
    st.integers(1, 60_000),  # ttl
    st.integers(1, 4),  # max_attempts
)
claim_steps = st.tuples(
    st.just("claim"), st.sampled_from(OWNERS), st.one_of(st.integers(1, 2_000), st.integers(1, 60_000))
)
finish_steps = st.tuples(
    st.just("finish"),
    st.one_of(st.just(0), st.integers(0, 24)),  # 0: the newest ticket; k: the k-th newest (stale or not)
    st.sampled_from(OUTCOMES),
    st.integers(0, 60_000),  # delay
)
redrive_steps = st.tuples(st.just("redrive"), st.sampled_from(JOB_IDS), st.integers(1, 60_000), st.sampled_from(NOTES))
time_steps = st.tuples(st.just("tick"), st.one_of(st.integers(0, 2_000), st.integers(0, 70_000)))
# Near the top of the time range, later steps run past it: both sides must refuse them with ValueError.
starts = st.one_of(st.integers(0, 10**6), st.integers(TIME_MAX_MS - 200_000, TIME_MAX_MS))
histories = st.lists(
    st.one_of(enqueue_steps, claim_steps, finish_steps, redrive_steps, time_steps),
    max_size=25,
)


class Clock:
    """The one ``now`` both sides read: the lab as an argument, the Queue through its injected clock."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def lab_ticket(ticket: dict[str, Any] | None) -> tuple[Any, ...] | None:
    if ticket is None:
        return None
    return tuple(ticket[key] for key in ("id", "qty", "owner", "token", "attempt", "lease_until"))


def product_ticket(tickets: list[Ticket]) -> tuple[Any, ...] | None:
    assert len(tickets) <= 1, "claim(limit=1) returned more than one ticket"
    if not tickets:
        return None
    (ticket,) = tickets
    assert ticket.queue == "default"
    return (ticket.id, ticket.body["qty"], ticket.fence.owner, ticket.token, ticket.attempt, ticket.lease_until)


class Sides:
    """The lab connection and the Queue, run step by step on the same clock."""

    def __init__(self, lab_con: sqlite3.Connection, queue: Queue, reader: sqlite3.Connection, clock: Clock) -> None:
        self.lab = lab_con
        self.queue = queue
        self.reader = reader
        self.clock = clock
        self.issued: list[int] = []  # the step indexes at which a ticket was issued, oldest first
        self.lab_tickets: dict[int, dict[str, Any]] = {}
        self.product_tickets: dict[int, Ticket] = {}

    def run_lab(self, index: int, step: Step) -> Any:
        kind, now = step[0], self.clock.now
        if kind == "enqueue":
            _, job_id, qty, ttl, max_attempts = step
            return lease.enqueue(self.lab, {"id": job_id, "qty": qty}, now, ttl, max_attempts)
        if kind == "claim":
            _, owner, lease_ms = step
            ticket = lease.claim(self.lab, owner, now, lease_ms)
            if ticket is not None:
                self.lab_tickets[index] = ticket
            return lab_ticket(ticket)
        if kind == "finish":
            _, pick, outcome, delay = step
            status = lease.finish(self.lab, self.lab_tickets[self.ticket_step(pick)], outcome, now, delay)
            return None if status is False else status
        _, job_id, ttl, note = step
        return lease.redrive(self.lab, job_id, now, ttl, note)

    async def run_product(self, index: int, step: Step) -> Any:
        kind = step[0]
        if kind == "enqueue":
            _, job_id, qty, ttl, max_attempts = step
            return await self.queue.enqueue(job_id, {"qty": qty}, max_attempts=max_attempts, ttl=ttl / 1000)
        if kind == "claim":
            _, owner, lease_ms = step
            tickets = await self.queue.claim(owner, queue="default", limit=1, lease=lease_ms / 1000)
            if tickets:
                self.product_tickets[index] = tickets[0]
            return product_ticket(tickets)
        if kind == "finish":
            _, pick, outcome, delay = step
            return await self.queue.finish(self.product_tickets[self.ticket_step(pick)], outcome, delay=delay / 1000)
        _, job_id, ttl, note = step
        await self.queue.redrive(job_id, note, ttl=ttl / 1000)
        return True  # the lab returns True; the facade its audit row, compared below

    def ticket_step(self, pick: int) -> int:
        return self.issued[-1 - pick % len(self.issued)]

    async def step(self, index: int, step: Step) -> None:
        if step[0] == "tick":
            self.clock.now += step[1]
        elif step[0] == "claim" and not orders_agree(self.lab, self.clock.now):
            pass  # the lab claims by seq, the product by ready time: compared only where they pick the same job
        elif step[0] != "finish" or self.issued:
            lab_result = outcome(lambda: self.run_lab(index, step))
            product_result = await async_outcome(self.run_product(index, step))
            assert lab_result == product_result, f"step {index} {step}: lab {lab_result} != Queue {product_result}"
            if step[0] == "claim" and lab_result[0] == "returned" and lab_result[1] is not None:
                self.issued.append(index)
        self.compare(index, step)

    def compare(self, index: int, step: Step) -> None:
        assert not self.lab.in_transaction
        lab_rows = self.lab.execute(f"SELECT {LIFECYCLE}, qty FROM jobs ORDER BY seq").fetchall()
        product_rows = [
            (*row[:-1], json.loads(row[-1])["qty"])
            for row in self.reader.execute(f"SELECT {LIFECYCLE}, body FROM asyncq_jobs ORDER BY seq")
        ]
        assert lab_rows == product_rows, f"after step {index} {step}"
        lab_audit = self.lab.execute("SELECT id, token, at_ms, note FROM redrives ORDER BY seq").fetchall()
        product_audit = self.reader.execute("SELECT id, token, at_ms, note FROM asyncq_audit ORDER BY seq").fetchall()
        assert lab_audit == product_audit, f"audit after step {index} {step}"


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("returned", call())
    except (ValueError, Conflict) as error:
        return ("raised", type(error).__name__)


async def async_outcome(pending: Any) -> tuple[str, Any]:
    try:
        return ("returned", await pending)
    except (ValueError, Conflict) as error:
        return ("raised", type(error).__name__)


async def replay(start: int, steps: Sequence[Step]) -> None:
    with tempfile.TemporaryDirectory(prefix="asyncq-diff-") as tmp:
        clock = Clock(start)
        lab_con = lease.open_queue(Path(tmp) / "lab.db")
        try:
            queue = await Queue.open(str(Path(tmp) / "product.db"), clock=clock)
            async with queue:
                reader = sqlite3.connect(Path(tmp) / "product.db", isolation_level=None)
                try:
                    sides = Sides(lab_con, queue, reader, clock)
                    for index, step in enumerate(steps):
                        await sides.step(index, step)
                finally:
                    reader.close()
        finally:
            lab_con.close()


# A hand-written history that reaches every branch: duplicate, conflict, take-over, stale finish, every
# finish outcome, redrive of live / missing / dead jobs, sweeps of pending and expired leased rows.
TOUR: list[Step] = [
    ("enqueue", "j0", 1, 60_000, 2),
    ("enqueue", "j0", 1, 5, 4),
    ("enqueue", "j0", 2, 60_000, 2),
    ("enqueue", "j1", 3, 1_000, 1),
    ("claim", "w1", 100),
    ("tick", 100),
    ("claim", "w2", 100),
    ("finish", 1, "ok", 0),
    ("finish", 0, "retry", 10),
    ("redrive", "j0", 60_000, "ops"),
    ("redrive", "j9", 60_000, "ops"),
    ("tick", 10),
    ("claim", "w1", 60_000),
    ("finish", 0, "retry", 0),
    ("redrive", "j1", 500, "fixed"),
    ("claim", "w1", 60_000),
    ("finish", 0, "permanent", 0),
    ("tick", 1_000),
    ("claim", "w2", 1),
    ("redrive", "j0", 60_000, "ops"),
    ("claim", "w2", 60_000),
    ("finish", 0, "ok", 0),
    ("finish", 0, "ok", 0),
    ("tick", 70_000),
    ("claim", "w1", 1_000),
    ("enqueue", "j2", 1, 2_000, 1),
    ("claim", "w1", 500),
    ("tick", 500),
    ("claim", "w2", 500),
    ("enqueue", "j3", 2, 1_000, 3),
    ("claim", "w1", 60_000),
    ("finish", 0, "retry", 60_000),
    ("enqueue", "j4", 3, 1_000, 3),
    ("claim", "w1", 60_000),
    ("tick", 1_000),
    ("claim", "w2", 1_000),
]


@settings(max_examples=60, deadline=None)
@given(start=starts, steps=histories)
@example(start=0, steps=TOUR)
def test_lab_and_queue_agree_after_every_step(start: int, steps: list[Step]) -> None:
    asyncio.run(replay(start, steps))
