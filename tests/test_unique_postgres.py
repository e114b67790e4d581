"""Unique keys on PostgreSQL while another transaction holds the key uncommitted (what the conformance suite, one
transaction at a time, cannot show): an enqueue waits for it and then answers with its id (commit) or inserts
(rollback); a redrive that meets it is refused as ``UniqueConflict`` once it commits, with nothing changed, never
an asyncpg ``UniqueViolationError``. Waits are read from ``pg_stat_activity``, never slept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from waiting import eventually

from asyncq import Queue
from asyncq.errors import UniqueConflict

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000


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


@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_an_enqueue_waits_for_an_uncommitted_holder(queue: Queue, postgres_url: str, ending: str) -> None:
    async with await Queue.open(postgres_url, clock=lambda: T0) as other:
        try:
            async with queue.transaction() as tx:
                assert await tx.enqueue("first", {}, unique_key="k") is True
                second = asyncio.create_task(other.enqueue("second", {}, unique_key="k"))
                await eventually(lambda: lock_waits(postgres_url), "the second enqueue to wait for the first")
                assert not second.done()
                if ending == "rollback":
                    raise Rollback
        except Rollback:
            pass
        assert await second == ("first" if ending == "commit" else True)
    statuses = {job.id: job.status for job in await queue.list_jobs()}
    assert statuses == ({"first": "pending"} if ending == "commit" else {"second": "pending"})


async def test_a_redrive_that_meets_an_uncommitted_holder_is_a_unique_conflict(queue: Queue, postgres_url: str) -> None:
    assert await queue.enqueue("a", {}, unique_key="k") is True
    assert (await queue.cancel("a", "ended")).state == "cancelled"
    async with await Queue.open(postgres_url, clock=lambda: T0) as other:
        async with queue.transaction() as tx:
            assert await tx.enqueue("b", {}, unique_key="k") is True
            redrive = asyncio.create_task(other.redrive("a", "try again"))
            await eventually(lambda: lock_waits(postgres_url), "the redrive to wait for the uncommitted holder")
            assert not redrive.done()
        with pytest.raises(UniqueConflict) as raised:
            await redrive
    assert (raised.value.existing_id, raised.value.job_id, raised.value.unique_key) == ("b", "a", "k")
    job = await queue.get("a")
    assert job is not None and (job.status, job.redrives) == ("dead", 0)
    assert [entry.action for entry in await queue.history("a")] == ["cancel"]  # no redrive audited
