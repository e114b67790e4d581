"""An idle pool's offer on each driver (``core.offers``): a group commit that claims nothing writes it, another
handle's enqueue claims for it in its own transaction (claimed ahead: token issued, attempt not counted), the pool
reads the jobs offered to it and its next commit counts their attempts; each commit takes what no read found; a
claim or no free slot withdraws the offer; what an enqueue claims for no offer (delayed, paused, another queue, an
offer ended or full); and a job offered to a pool that never takes it runs after its lease ends."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from drivers import Driver

from asyncq.core.flow_limits import Limits
from asyncq.core.jobs import Settled, Ticket
from asyncq.core.offers import Offer
from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, enqueue, new, outcome

pytestmark = pytest.mark.timeout(30)

LEASE_MS = 1_000


async def commit(
    store: QueueStore,
    offer: Offer,
    now: int = T0,
    *,
    owner: str = "idle",
    queues: Sequence[str] = ("default",),
    started: Sequence[Ticket] = (),
) -> Settled:
    """A pool's group commit that finishes nothing, asks each of ``queues`` for 4 jobs and says ``offer``."""
    wants = [(queue, 4) for queue in queues]
    return await store.settle_and_claim([], now, owner, LEASE_MS, wants, None, started=started, offer=offer)


def writes(slots: int = 4, until: int = T0 + 5_000) -> Offer:
    """The offer of an idle pool with no offer out."""
    return Offer(slots, until, out=False)


def holds(picked: Sequence[Ticket] = (), slots: int = 4) -> Offer:
    """The offer of a pool with its offer out, which its reads found ``picked`` in."""
    return Offer(slots, 0, out=True, drain=True, picked=frozenset(ticket.seq for ticket in picked))


async def test_an_enqueue_claims_for_an_idle_pools_offer_and_the_pool_reads_starts_and_counts_it(
    store: QueueStore, driver: Driver
) -> None:
    assert await commit(store, writes()) == Settled([], [], [], ())  # nothing to claim: the offer is out
    other = await driver.open_another(store)  # another process's enqueue
    try:
        await enqueue(other, new("job-1", T0 + 10))
    finally:
        await other.close()
    job = (await dump(store, T0 + 10)).jobs["job-1"]  # the stats, the listing and the history agree with it
    assert (job.status, job.owner, job.token, job.attempts, job.lease_until) == (
        "leased", "idle", 1, 0, T0 + 10 + LEASE_MS
    )  # fmt: skip
    [ticket] = await store.offered("idle", T0 + 20)
    assert (ticket.id, ticket.counted, ticket.fence) == ("job-1", False, (("idle", 1, 0, T0 + 10 + LEASE_MS)))
    assert await store.offered("someone-else", T0 + 20) == []
    # the handler started it; the next commit counts its attempt and returns it no more
    settled = await commit(store, holds([ticket]), T0 + 30, started=[ticket])
    assert (settled.tickets, settled.started) == ([], [True])
    assert await store.offered("idle", T0 + 40) == []  # its note is gone with that commit
    counted = ticket.started()
    assert await store.finish([outcome(counted, "ok")], T0 + 50) == ["done"]
    done = await store.get("job-1")
    assert done is not None and (done.status, done.attempts, done.token) == ("done", 1, 1)
    await dump(store)  # every view of the store agrees (stats, listing, history)


async def test_a_commit_takes_the_jobs_offered_that_no_read_found_and_only_those(store: QueueStore) -> None:
    await commit(store, writes())
    await enqueue(store, new("job-1", T0 + 1), new("job-2", T0 + 1))
    read = await store.offered("idle", T0 + 2)
    assert [ticket.id for ticket in read] == ["job-1", "job-2"]
    await enqueue(store, new("job-3", T0 + 3))  # after the read: the commit returns it, and not the two read
    settled = await commit(store, holds(read), T0 + 4)
    assert [(ticket.id, ticket.counted) for ticket in settled.tickets] == [("job-3", False)]
    assert await store.offered("idle", T0 + 5) == []


async def test_an_offer_gives_a_pool_no_more_jobs_than_its_slots_until_its_commit_takes_them(
    store: QueueStore,
) -> None:
    await commit(store, writes(slots=2))
    await enqueue(store, new("job-1", T0 + 1))
    await enqueue(store, *(new(f"job-{n}", T0 + 2) for n in (2, 3, 4)))
    jobs = await dump(store)
    assert {job_id: job.status for job_id, job in jobs.jobs.items()} == {
        "job-1": "leased", "job-2": "leased", "job-3": "pending", "job-4": "pending"
    }  # fmt: skip
    taken = await commit(store, holds(), T0 + 3)  # takes both; the pool claims job-3 and job-4 itself (4 wanted)
    assert [(ticket.id, ticket.counted) for ticket in taken.tickets] == [
        ("job-3", True), ("job-4", True), ("job-1", False), ("job-2", False)
    ]  # fmt: skip
    await enqueue(store, new("job-5", T0 + 4))  # the claim withdrew the offer
    assert (await store.get("job-5")).status == "pending"  # type: ignore[union-attr]


async def test_jobs_enqueued_one_by_one_go_to_the_offer_with_the_most_slots_left(store: QueueStore) -> None:
    await commit(store, writes(slots=1), owner="small")
    await commit(store, writes(slots=3), owner="large")
    for n in range(1, 6):
        await enqueue(store, new(f"job-{n}", T0 + n))
    jobs = (await dump(store)).jobs
    # room left (small, large) before each: (1, 3) (1, 2) then a tie at (1, 1), (0, 1) or (1, 0), then (0, 0)
    owners = [jobs[f"job-{n}"].owner for n in range(1, 6)]
    assert owners[:2] == ["large", "large"] and sorted(owners[2:4]) == ["large", "small"]  # type: ignore[type-var]
    assert (jobs["job-5"].status, jobs["job-5"].owner) == ("pending", None)  # every offer full


@pytest.mark.parametrize("alone", [True, False], ids=["one-by-one", "one-batch"])
async def test_an_enqueue_claims_for_no_offer_when_its_job_is_not_ready_now(store: QueueStore, alone: bool) -> None:
    await commit(store, writes(), queues=("default", "paused", "limited"))
    await store.set_paused("paused", True, T0, "stop", "ops")
    await store.set_limits("limited", Limits(concurrency=5), T0, "cap", "ops")
    rows = [
        new("later", T0 + 1, delay_ms=100),  # delayed
        new("held", T0 + 1, queue="paused"),  # its queue is paused: the claim statement takes nothing
        new("capped", T0 + 1, queue="limited"),  # a limited queue is claimed under its limits, by the pool
        new("elsewhere", T0 + 1, queue="other"),  # no pool offered for its queue
    ]
    for batch in [[row] for row in rows] if alone else [rows]:
        await enqueue(store, *batch)
    assert {job.id: job.status for job in (await dump(store, T0 + 1)).jobs.values()} == {
        "later": "pending", "held": "pending", "capped": "pending", "elsewhere": "pending"
    }  # fmt: skip
    assert await store.offered("idle", T0 + 2) == []
    await enqueue(store, new("after-end", T0 + 5_000))  # the offer ends at T0 + 5 s
    assert (await store.get("after-end")).status == "pending"  # type: ignore[union-attr]


async def test_one_job_enqueued_behind_a_ready_one_is_left_to_the_pools_claim_so_the_order_holds(
    store: QueueStore,
) -> None:
    await enqueue(store, new("first", T0, priority=-5))
    await commit(store, writes(), T0 - 1)  # the pool's commit ran before "first" was ready: its offer is out
    await enqueue(store, new("second", T0 + 1, priority=5))
    assert {job.id: job.status for job in (await dump(store, T0 + 1)).jobs.values()} == {
        "first": "pending", "second": "pending"
    }  # fmt: skip
    [ticket] = await claim(store, "idle", T0 + 2)
    assert ticket.id == "second"  # the claim order: the higher priority first


async def test_an_id_or_key_taken_is_answered_as_without_an_offer(store: QueueStore) -> None:
    await commit(store, writes())
    await enqueue(store, new("job-1", T0 + 1, unique_key="k"))
    assert await store.enqueue([new("job-1", T0 + 2, unique_key="k")]) == [False]  # the same job again
    assert await store.enqueue([new("job-2", T0 + 3, unique_key="k")]) == ["job-1"]  # its key's holder
    assert [job.id for job in (await dump(store, T0 + 3)).jobs.values()] == ["job-1"]
    assert [ticket.id for ticket in await store.offered("idle", T0 + 4)] == ["job-1"]


async def test_a_claim_or_no_free_slot_withdraws_the_offer(store: QueueStore) -> None:
    await commit(store, writes())
    await enqueue(store, new("job-1", T0 + 1))
    [ticket] = await store.offered("idle", T0 + 2)
    settled = await commit(store, holds([ticket], slots=0), T0 + 3, started=[ticket])  # all slots busy
    assert settled.started == [True]
    await enqueue(store, new("job-2", T0 + 4))
    assert (await store.get("job-2")).status == "pending"  # type: ignore[union-attr]
    await commit(store, writes(until=T0 + 10_000), T0 + 5)  # job-2 is ready: the pool claims it, writes no offer
    await enqueue(store, new("job-3", T0 + 6))
    assert (await store.get("job-3")).status == "pending"  # type: ignore[union-attr]


async def test_a_job_offered_to_a_pool_that_never_takes_it_runs_when_its_lease_ends(store: QueueStore) -> None:
    await commit(store, writes(), owner="killed")
    await enqueue(store, new("job-1", T0 + 1))
    assert await claim(store, "w2", T0 + LEASE_MS) == []  # leased to the killed pool until T0 + 1 + lease
    [ticket] = await claim(store, "w2", T0 + 1 + LEASE_MS)
    assert (ticket.id, ticket.fence.token, ticket.fence.attempt) == ("job-1", 2, 1)  # its first attempt: none spent
    assert await store.finish([outcome(ticket, "ok")], T0 + 2 + LEASE_MS) == ["done"]
    # a later pool's offer clears the killed pool's ended offer and its notes
    await commit(store, writes(until=T0 + 20_000), T0 + 10_000, owner="next")
    await enqueue(store, new("job-2", T0 + 10_001))
    assert (await store.get("job-2")).owner == "next"  # type: ignore[union-attr]
    assert await store.offered("killed", T0 + 10_002) == []
