"""Several clients on one store: two handles (each its own connection, as two processes have) claiming at once
never lease a job twice; the same ticket finished through both lands once; ``close`` waits for the transaction in
progress, which commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from drivers import Driver

from asyncq.core.jobs import Ticket
from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, new, outcome, stored

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def another(driver: Driver, store: QueueStore) -> AsyncIterator[QueueStore]:
    other = await driver.open_another(store)
    try:
        yield other
    finally:
        await other.close()


async def drain(store: QueueStore, owner: str) -> list[Ticket]:
    """Claim 7 at a time until nothing is left."""
    taken: list[Ticket] = []
    while batch := await claim(store, owner, T0, n=7, lease_ms=60_000):
        taken += batch
    return taken


async def test_claims_racing_on_two_handles_lease_each_job_once(store: QueueStore, driver: Driver) -> None:
    rows = [new(f"job-{n:03d}") for n in range(120)]
    assert await store.enqueue(rows) == [True] * 120
    async with another(driver, store) as other:
        owners = [(handle, f"{name}-{k}") for handle, name in ((store, "a"), (other, "b")) for k in range(3)]
        results = await asyncio.gather(*(drain(handle, owner) for handle, owner in owners))
    tickets = {t.id: (owner, t) for (_, owner), batch in zip(owners, results, strict=True) for t in batch}
    assert sum(map(len, results)) == len(tickets) == 120  # every job, none twice
    after = await dump(store, deep=False)
    for row in rows:
        owner, ticket = tickets[row.id]
        job = replace(stored(row, ticket.seq), status="leased", attempts=1, token=1, owner=owner,
                      lease_until=T0 + 60_000)  # fmt: skip
        assert after.jobs[row.id] == job and ticket.fence == (owner, 1, 1, T0 + 60_000)


async def test_one_ticket_finished_through_two_handles_at_once_lands_once(store: QueueStore, driver: Driver) -> None:
    await store.enqueue([new(f"job-{n}") for n in range(20)])
    tickets = await claim(store, "w1", T0, n=20, lease_ms=60_000)
    async with another(driver, store) as other:
        first, second = await asyncio.gather(
            asyncio.gather(*(store.finish([outcome(t, "ok")], T0 + 1) for t in tickets)),
            asyncio.gather(*(other.finish([outcome(t, "retry", 5, held=False)], T0 + 1) for t in tickets)),
        )
    jobs = (await dump(store, T0 + 1)).jobs
    for ticket, [mine], [theirs] in zip(tickets, first, second, strict=True):
        assert {mine, theirs} in ({"done", None}, {"pending", None}), (ticket.id, mine, theirs)
        assert jobs[ticket.id].status == (mine or theirs)


async def test_close_waits_for_the_transaction_in_progress_which_commits(store: QueueStore, driver: Driver) -> None:
    async with another(driver, store) as handle:
        inside, finish = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with handle.transaction() as tx:
                await tx.enqueue_rows([new("committed")])
                inside.set()
                await finish.wait()

        holder = asyncio.create_task(hold())
        await inside.wait()
        closing = asyncio.create_task(handle.close())
        for _ in range(3):  # loop steps: ``close`` starts (and waits for the lock) before the block goes on
            await asyncio.sleep(0)
        assert not closing.done()
        finish.set()
        async with asyncio.timeout(5):
            await holder
            await closing
    # A close that did not wait would have rolled the block back, and its COMMIT would have failed.
    job = await store.get("committed")
    assert job == stored(new("committed"), job.seq if job else 0)
