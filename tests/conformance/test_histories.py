"""Random histories through the port, on each driver.

1. Against the lease lab (``asyncq.lab.lease``), the lifecycle's reference on its own SQLite file: after every
   enqueue, claim, finish (fresh or stale ticket), redrive and clock step, the return values, every lifecycle
   column of every job and the audit rows must be equal.
2. With the product-only moves too (extend, release, cancel, batches of finishes): every row change an operation
   makes must be one ``TRANSITIONS`` lists for it, and the invariants of docs/state-machine.md must hold.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from drivers import Driver
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lab_order import orders_agree

from asyncq.core.jobs import Job, Ticket
from asyncq.core.lifecycle import DEAD_REASONS, TRANSITIONS
from asyncq.errors import Conflict
from asyncq.lab import lease
from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, new, outcome

pytestmark = pytest.mark.timeout(120)

MOVES = {(t.source, t.target, t.reason, t.actor) for t in TRANSITIONS}
IDS = ("j0", "j1", "j2", "j3")
OWNERS = ("w1", "w2")
LIFECYCLE = ("status", "attempts", "max_attempts", "token", "available_at", "deadline", "owner", "lease_until",
             "reason")  # fmt: skip

ticks = st.tuples(st.just("tick"), st.one_of(st.integers(0, 2_000), st.integers(0, 70_000)))
enqueues = st.tuples(
    st.just("enqueue"), st.sampled_from(IDS), st.integers(1, 3), st.integers(1, 60_000), st.integers(1, 4)
)
claims = st.tuples(st.just("claim"), st.sampled_from(OWNERS), st.one_of(st.integers(1, 2_000), st.integers(1, 60_000)))
finishes = st.tuples(
    st.just("finish"),
    st.integers(0, 9),
    st.sampled_from(("ok", "retry", "permanent")),
    st.integers(0, 60_000),
    st.booleans(),
)
redrives = st.tuples(st.just("redrive"), st.sampled_from(IDS), st.integers(1, 60_000))
extends = st.tuples(st.just("extend"), st.integers(0, 9), st.integers(1, 5_000))
releases = st.tuples(st.just("release"), st.integers(0, 9))
cancels = st.tuples(st.just("cancel"), st.sampled_from(IDS))
batches = st.tuples(
    st.just("batch"), st.lists(st.integers(0, 9), min_size=1, max_size=4), st.sampled_from(("ok", "retry", "permanent"))
)
lab_steps = st.lists(st.one_of(enqueues, claims, finishes, redrives, ticks), max_size=20)
port_steps = st.lists(
    st.one_of(enqueues, claims, finishes, redrives, ticks, extends, releases, cancels, batches), max_size=20
)


@dataclass
class History:
    """One history's store, its clock and the tickets handed out (newest last)."""

    store: QueueStore
    now: int = T0
    tickets: list[Ticket] = field(default_factory=list)
    lab_tickets: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)

    def pick(self, k: int) -> int:
        return len(self.tickets) - 1 - k % len(self.tickets)


async def attempt(call: Awaitable[Any] | Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("returned", await call if isinstance(call, Awaitable) else call())
    except (ValueError, Conflict) as error:
        return ("raised", type(error).__name__)


async def run_port(h: History, step: tuple[Any, ...]) -> tuple[str, Any]:
    """One step on the store; what it returned (tickets as the lab's ticket tuples)."""
    kind, store, now = step[0], h.store, h.now
    if kind == "enqueue":
        _, job_id, qty, ttl, budget = step
        return await attempt(
            first(store.enqueue([new(job_id, now, body={"qty": qty}, ttl_ms=ttl, max_attempts=budget)]))
        )
    if kind == "claim":
        tickets = await claim(store, step[1], now, lease_ms=step[2])
        h.tickets += tickets
        return ("returned", [(t.id, t.body["qty"], t.fence.owner, t.token, t.attempt, t.lease_until) for t in tickets])
    if kind == "finish":
        _, k, result, delay, held = step
        return await attempt(first(store.finish([outcome(h.tickets[h.pick(k)], result, delay, held=held)], now)))
    if kind == "redrive":
        _, job_id, ttl = step
        return await attempt(_redriven(store.redrive(job_id, now, now + ttl, "ops")))
    if kind == "extend":
        ticket = h.tickets[h.pick(step[1])]
        [renewal] = await store.extend([(ticket.id, ticket.fence)], now, step[2])
        fence = None if renewal is None else renewal.fence
        if fence is not None:
            h.tickets.append(
                Ticket(
                    ticket.id, ticket.queue, ticket.body_json, fence, ticket.deadline, ticket.max_attempts, ticket.seq
                )
            )
        return ("returned", fence)
    if kind == "release":
        ticket = h.tickets[h.pick(step[1])]
        return ("returned", await store.release([(ticket.id, ticket.fence)], now))
    if kind == "cancel":
        return await attempt(store.cancel(step[1], now, "ops"))
    _, picks, result = step
    return ("returned", await store.finish([outcome(h.tickets[h.pick(k)], result) for k in picks], now))


async def _redriven(call: Awaitable[Any]) -> bool:
    await call
    return True  # the lab's answer; the audit row itself is compared with the lab's after the step


async def first(call: Awaitable[list[Any]]) -> Any:
    [only] = await call
    return only


def run_lab(con: sqlite3.Connection, h: History, step: tuple[Any, ...]) -> Any:
    kind, now = step[0], h.now
    if kind == "enqueue":
        _, job_id, qty, ttl, budget = step
        return lease.enqueue(con, {"id": job_id, "qty": qty}, now, ttl, budget)
    if kind == "claim":
        ticket = lease.claim(con, step[1], now, step[2])
        h.lab_tickets += [] if ticket is None else [ticket]
        return [] if ticket is None else [tuple(ticket[key] for key in lease.TICKET_KEYS)]
    if kind == "finish":
        _, k, result, delay, _held = step
        return lease.finish(con, h.lab_tickets[h.pick(k)], result, now, delay) or None
    _, job_id, ttl = step
    return lease.redrive(con, job_id, now, ttl, "ops")


def actor_of(kind: str, old: Job, new_: Job) -> str:
    if kind == "claim":
        return "claim" if new_.token != old.token else "sweep"
    return {"batch": "finish"}.get(kind, kind)


def check_moves(h: History, kind: str, before: dict[str, Job], after: dict[str, Job]) -> None:
    """Every row the step changed made a listed move for it; the invariants hold on every row."""
    assert set(before) <= set(after), "a job disappeared"
    for job_id, old in before.items():
        moved = after[job_id]
        if moved != old:
            move = (old.status, moved.status, moved.reason, actor_of(kind, old, moved))
            assert move in MOVES, f"{kind} made an unlisted move {move}: {old} -> {moved}"
    for job in after.values():
        assert job.token >= h.tokens.get(job.id, 0), f"the token of {job.id} went down"
        h.tokens[job.id] = job.token
        assert (job.owner is not None) == (job.lease_until is not None) == (job.status == "leased"), job
        if job.status == "leased":
            assert job.lease_until is not None and job.lease_until <= job.deadline and job.reason is None, job
            assert 1 <= job.attempts <= job.max_attempts, job
        elif job.status == "pending":
            assert job.reason in (None, "retry") and job.attempts < job.max_attempts, job
        elif job.status == "dead":
            assert job.reason in DEAD_REASONS, job


async def replay(driver: Driver, steps: list[tuple[Any, ...]], *, lab: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="asyncq-history-") as tmp:
        async with driver.fresh(Path(tmp)) as store:
            con = lease.open_queue(Path(tmp) / "lab.db") if lab else None
            try:
                h = History(store)
                for index, step in enumerate(steps):
                    await one_step(h, con, index, step)
            finally:
                if con is not None:
                    con.close()


async def one_step(h: History, con: sqlite3.Connection | None, index: int, step: tuple[Any, ...]) -> None:
    if step[0] == "tick":
        h.now += step[1]
        return
    if step[0] in ("finish", "extend", "release", "batch") and not h.tickets:
        return
    if step[0] == "claim" and con is not None and not orders_agree(con, h.now):
        return  # the lab claims by seq, the product by ready time: compared only where they pick the same job
    before = (await dump(h.store, h.now)).jobs
    result = await run_port(h, step)
    after = (await dump(h.store, h.now)).jobs
    check_moves(h, step[0], before, after)
    if con is None:
        return
    assert await attempt(lambda: run_lab(con, h, step)) == result, f"step {index} {step}"
    lab_rows = con.execute(f"SELECT id, {', '.join(LIFECYCLE)}, qty FROM jobs ORDER BY seq").fetchall()
    port_rows = [(job.id, *(getattr(job, column) for column in LIFECYCLE), job.body["qty"]) for job in after.values()]
    assert lab_rows == port_rows, f"after step {index} {step}"
    lab_audit = con.execute("SELECT id, token, at_ms, note FROM redrives ORDER BY seq").fetchall()
    port_audit = [(e.id, e.token, e.at_ms, e.note) for e in reversed(await h.store.audit_log(1_000))]
    assert lab_audit == port_audit, f"audit after step {index} {step}"


# A history reaching every branch: repeat, conflict, take-over, stale finish, each outcome, refused and real
# redrives, sweeps of pending and expired leased rows.
TOUR = [
    ("enqueue", "j0", 1, 60_000, 2), ("enqueue", "j0", 1, 5, 4), ("enqueue", "j0", 2, 60_000, 2),
    ("enqueue", "j1", 3, 1_000, 1), ("claim", "w1", 100), ("tick", 100), ("claim", "w2", 100),
    ("finish", 1, "ok", 0, True), ("finish", 0, "retry", 10, False), ("redrive", "j0", 60_000),
    ("redrive", "j9", 60_000), ("tick", 10), ("claim", "w1", 60_000), ("finish", 0, "retry", 0, True),
    ("redrive", "j1", 500), ("claim", "w1", 60_000), ("finish", 0, "permanent", 0, False), ("tick", 1_000),
    ("claim", "w2", 1), ("redrive", "j0", 60_000), ("claim", "w2", 60_000), ("finish", 0, "ok", 0, True),
    ("tick", 70_000), ("claim", "w1", 1_000), ("enqueue", "j2", 1, 2_000, 1), ("claim", "w1", 500), ("tick", 500),
    ("claim", "w2", 500), ("enqueue", "j3", 2, 1_000, 3), ("claim", "w1", 60_000), ("finish", 0, "retry", 60_000, True),
]  # fmt: skip
PORT_TOUR = [
    ("enqueue", "j0", 1, 60_000, 2), ("enqueue", "j1", 1, 60_000, 2), ("claim", "w1", 1_000),
    ("extend", 0, 2_000), ("release", 1), ("release", 0), ("claim", "w1", 1_000), ("cancel", "j1"),
    ("batch", [0, 0], "retry"), ("cancel", "j0"), ("redrive", "j0", 60_000), ("claim", "w2", 100),
    ("batch", [0, 1, 2], "ok"),
]  # fmt: skip
#: Examples per random-history test (CI-sized); raise it for a longer search, e.g. ASYNCQ_HISTORY_EXAMPLES=2000.
EXAMPLES = int(os.environ.get("ASYNCQ_HISTORY_EXAMPLES", "25"))
HISTORY_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HISTORY_SETTINGS
@given(steps=lab_steps)
@example(steps=TOUR)
def test_the_store_agrees_with_the_lab_after_every_step(driver: Driver, steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(replay(driver, steps, lab=True))


@HISTORY_SETTINGS
@given(steps=port_steps)
@example(steps=PORT_TOUR)
def test_every_change_of_a_random_history_is_a_listed_move(driver: Driver, steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(replay(driver, steps, lab=False))
