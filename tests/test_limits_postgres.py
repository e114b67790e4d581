"""Limits on PostgreSQL while other transactions claim at once (what the conformance suite, one transaction at a
time, cannot show; docs/flow-control.md, "Limits"). Under ``READ COMMITTED`` a claim cannot see another host's
claim that has not committed yet: counting leases then could exceed the limit. A limited claim first locks its
queue's settings row, so a second host's claim waits for the first to commit (or roll back) and then counts its
leases; a second limited queue whose lock another transaction holds is skipped, not waited for (no deadlock).
Waits are read from ``pg_stat_activity``, never slept."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import asyncpg
import pytest
from waiting import eventually

from asyncq import Queue
from asyncq.core.claim_plan import plan_claim
from asyncq.core.flow_limits import Hold
from asyncq.store.postgres import claiming
from asyncq.store.postgres.connection import parse_url

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000
LEASE = 30_000


class Rollback(Exception):
    """Raised inside a transaction's block to roll it back."""


@pytest.fixture
async def queue(postgres_url: str) -> AsyncIterator[Queue]:
    async with await Queue.open(postgres_url, clock=lambda: T0) as opened:
        yield opened


async def lock_waits(url: str) -> bool:
    conn = await asyncpg.connect(url.split("?")[0], timeout=5)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    finally:
        await conn.close()
    return bool(found >= 1)


async def claim_open(conn: asyncpg.Connection, schema: str, queue: str, n: int) -> int:
    """Claim up to ``n`` jobs of ``queue`` as a group commit does, inside the caller's open transaction."""
    tickets, _holds = await claiming.claim(
        conn, schema, "host-a", T0, LEASE, [(queue, n)], plan_claim([n], None, None), set()
    )
    return len(tickets)


@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_a_second_host_waits_for_an_uncommitted_claim_and_then_counts_it(
    queue: Queue, postgres_url: str, ending: str
) -> None:
    for n in range(6):
        await queue.enqueue(f"j{n}", {}, queue="mail")
    await queue.set_limits("mail", concurrency=2)
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        async with await Queue.open(postgres_url, clock=lambda: T0) as other:
            try:
                async with conn.transaction():
                    assert await claim_open(conn, target.schema, "mail", 2) == 2  # host A: both slots, uncommitted
                    second = asyncio.create_task(
                        other.store.settle_and_claim([], T0, "host-b", LEASE, [("mail", 2)], None)
                    )
                    await eventually(lambda: lock_waits(postgres_url), "host B's claim to wait for host A's")
                    assert not second.done()
                    if ending == "rollback":
                        raise Rollback
            except Rollback:
                pass
            settled = await second
    finally:
        await conn.close()
    if ending == "commit":  # A's two leases counted: nothing for B, held until the first of them may expire
        assert settled.tickets == [] and settled.holds == (Hold("mail", T0 + LEASE, False),)
    else:
        assert [ticket.id for ticket in settled.tickets] == ["j0", "j1"]
    leased = await queue.list_jobs(status="leased")
    assert len(leased) == 2


async def test_a_second_limited_queue_whose_lock_is_held_is_skipped_not_waited_for(
    queue: Queue, postgres_url: str
) -> None:
    """Host A holds q1's lock (its claim not committed); host B claims q2 then q1 in one commit: it takes q2's jobs
    and skips q1 rather than wait for it while holding q2's lock (two hosts in the other order would deadlock)."""
    for name in ("q1", "q2"):
        for n in range(2):
            await queue.enqueue(f"{name}-{n}", {}, queue=name)
        await queue.set_limits(name, concurrency=5)
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        async with await Queue.open(postgres_url, clock=lambda: T0) as other, conn.transaction():
            assert await claim_open(conn, target.schema, "q1", 1) == 1
            settled = await other.store.settle_and_claim([], T0, "host-b", LEASE, [("q2", 5), ("q1", 5)], None)
            assert sorted(ticket.id for ticket in settled.tickets) == ["q2-0", "q2-1"]  # q1 skipped this commit
    finally:
        await conn.close()
    async with await Queue.open(postgres_url, clock=lambda: T0) as other:
        settled = await other.store.settle_and_claim([], T0, "host-b", LEASE, [("q2", 5), ("q1", 5)], None)
        assert [ticket.id for ticket in settled.tickets] == ["q1-1"]  # its next commit takes it


async def test_hosts_claiming_and_finishing_at_once_never_hold_more_than_the_limits(postgres_url: str) -> None:
    """Four handles (hosts) claim and finish a queue limited to 3 at once and 1 per key, as fast as they can. Each
    logs a claim after its commit returned and a finish before it starts: at any point of the log, the jobs claimed
    and not yet finishing were all leased at once in the store, so the log never shows more than the store held."""
    clock = itertools.count(T0)  # every call a later ms: leases (a minute) never expire during the test
    handles = [await Queue.open(postgres_url, clock=lambda: next(clock)) for _ in range(4)]
    log: list[tuple[str, str]] = []
    try:
        first = handles[0]
        for n in range(120):
            await first.enqueue(f"j{n}", {}, queue="mail", limit_key=f"k{n % 5}", priority=n % 3)
        await first.set_limits("mail", concurrency=3, per_key_concurrency=1)

        async def work(handle: Queue, name: str) -> None:
            while True:
                tickets = await handle.claim(name, queue="mail", limit=3, lease=60.0)
                log.extend(("claimed", ticket.id) for ticket in tickets)
                if not tickets:
                    if not await handle.list_jobs(status="pending", limit=1):
                        return
                    await asyncio.sleep(0)  # another handle holds the slots: let it finish
                    continue
                await asyncio.sleep(0.002)  # the jobs' work: other hosts claim meanwhile
                log.extend(("finishing", ticket.id) for ticket in tickets)
                assert await handle.finish_many([(ticket, "ok", 0) for ticket in tickets]) == ["done"] * len(tickets)

        await asyncio.gather(*(work(handle, f"host-{n}") for n, handle in enumerate(handles)))
        jobs = {job.id: job for job in await first.list_jobs(limit=1000)}
    finally:
        for handle in handles:
            await handle.close()
    assert {job.status for job in jobs.values()} == {"done"} and len(jobs) == 120
    running: set[str] = set()
    most = 0
    for event, job_id in log:
        if event == "claimed":
            running.add(job_id)
            keys = [jobs[held].limit_key for held in running]
            assert len(keys) == len(set(keys)), f"two jobs of one key at once: {sorted(running)}"
            most = max(most, len(running))
        else:
            running.discard(job_id)
    assert most <= 3
    assert most == 3  # the limit was reached, not only respected
