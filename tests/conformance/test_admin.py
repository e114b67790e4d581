"""What a store tells and does for an operator, through the port: ``stats`` figures, ``prunable``/``prune`` and
when a job counts as ended, ``describe``, ``capabilities``, a read-only handle, ``backup``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from drivers import Driver

from asyncq.core.stats import OwnerLeases
from asyncq.errors import StoreError
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import BOOM, T0, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


async def test_stats_count_states_reasons_ages_leases_and_attempts(store: QueueStore) -> None:
    await enqueue(store, new("x", max_attempts=1), new("p0"), new("p1"), new("p2"))
    [x] = await claim(store, "w0", T0)
    assert await store.finish([outcome(x, "retry")], T0) == ["dead"]
    await store.cancel("p2", T0, "n")
    await store.enqueue([new("late", T0 + 1_000, delay_ms=60_000)])  # pending but not ready: no age yet
    await store.enqueue([new(f"l{n}", T0 + 1_000) for n in range(4)])
    stats = await store.stats(T0 + 1_000)
    assert stats.by_status == {"pending": 7, "leased": 0, "done": 0, "dead": 2, "waiting": 0}
    assert stats.dead_by_reason == {"cancelled": 1, "exhausted": 1}
    assert (stats.oldest_ready_age_ms, stats.leases, stats.expired_leases) == (1_000, [], 0)  # p0, enqueued at T0

    a = await claim(store, "owner-a", T0 + 1_000, n=2, lease_ms=5_000)  # p0, p1
    [b0] = await claim(store, "owner-b", T0 + 1_500, lease_ms=5_000)  # l0
    assert await store.finish([outcome(b0, "ok")], T0 + 1_500) == ["done"]
    b = await claim(store, "owner-b", T0 + 1_500, n=2, lease_ms=5_000)  # l1, l2
    stats = await store.stats(T0 + 1_750)
    assert (stats.now_ms, stats.total, stats.expired_leases) == (T0 + 1_750, 9, 0)
    assert stats.by_status == {"pending": 2, "leased": 4, "done": 1, "dead": 2, "waiting": 0}
    assert stats.oldest_ready_age_ms == 750  # l3, enqueued at T0 + 1000; "late" is not ready
    assert stats.leases == [OwnerLeases("owner-a", 2, a[0].lease_until), OwnerLeases("owner-b", 2, b[0].lease_until)]
    assert stats.attempts == {0: 2, 1: 4}
    assert (await store.stats(T0 + 6_500)).expired_leases == 4
    assert (await store.stats(T0 - 1)).oldest_ready_age_ms is None  # a clock behind every row: nothing is ready
    await dump(store, T0 + 6_500)  # every figure agrees with the rows


async def test_stats_agree_with_the_listing_after_every_kind_of_move(store: QueueStore, driver: Driver) -> None:
    """Hundreds of jobs through every move, a claim ahead and its start, a batch that fails half-way, and columns
    set directly (the test factory, as an app's own SQL would): after each step every figure of ``stats`` is what
    ``list_jobs`` says (``dump`` checks it), at two clock readings."""
    await store.enqueue(
        [new(f"j{n}", queue="mail" if n % 3 else "default", max_attempts=1 + n % 3) for n in range(300)]
    )
    steps = 0

    async def check() -> None:
        nonlocal steps
        steps += 1
        for now in (T0, T0 + 70_000):
            await dump(store, now, deep=False)

    await check()
    for queue, owner in (("default", "w1"), ("mail", "w2"), ("mail", "w3")):
        tickets = await claim(store, owner, T0, queue=queue, n=40, lease_ms=5_000)
        results = ["ok", "retry", "permanent", "keep"]
        finishes = [outcome(t, results[n % 4], 10) for n, t in enumerate(tickets) if results[n % 4] != "keep"]
        await store.finish(finishes, T0 + 1)
        await check()
    settled = await store.settle_and_claim([], T0 + 2, "w4", 5_000, [("default", 6)], 6, start_now=2)
    await store.settle_and_claim([], T0 + 3, "w4", 5_000, [], 0, started=settled.tickets[2:4])
    assert await store.release([(t.id, t.fence) for t in settled.tickets[4:]], T0 + 4, [False, False]) == [True] * 2
    await check()
    [waiting] = await store.list_jobs(JobFilter(status="pending", limit=1))
    await store.cancel(waiting.id, T0 + 5, "ops")
    dead = [job.id for job in await store.list_jobs(JobFilter(status="dead", limit=5))]
    for job_id in dead[:3]:
        await store.redrive(job_id, T0 + 6, T0 + 60_000, "ops")
    await check()
    driver.force(store, "j9", {"status": "dead", "reason": "app", "owner": None, "lease_until": None})
    driver.force(store, "j12", {"attempts": 7})
    await check()
    await claim(store, "w6", T0 + 70_000, queue="mail", n=50)  # sweeps leases past their deadline and budgets
    await store.prune(T0 + 70_000, ("done", "dead"), vacuum=False, now_ms=T0 + 70_000)
    await check()
    await store.enqueue([new(f"k{n}", T0 + 70_000) for n in range(10)])
    tickets = await claim(store, "w5", T0 + 70_000, n=10)
    driver.refuse_updates_of(store, tickets[-1].id)  # the batch fails at its last job: none of it lands (last step:
    with pytest.raises(Exception, match="refused by the test"):  # the refusal stays)
        await store.finish([outcome(t, "ok") for t in tickets], T0 + 70_001)
    await check()
    assert steps == 9


async def ended_in_every_way(store: QueueStore) -> None:
    """Ended jobs: done at T0+10, permanent at T0+20, cancelled at T0+30, exhausted by a finish at T0+40 (deadline
    T0+60000), swept at its deadline T0+1000, one leased, one pending."""
    await enqueue(
        store,
        new("done"),
        new("permanent"),
        new("exhausted", max_attempts=1),
        new("cancelled"),
        new("swept", ttl_ms=1_000),
        new("leased"),
        new("pending"),
    )
    done, permanent, exhausted = await claim(store, "w1", T0, n=3)
    assert exhausted.id == "exhausted"
    assert await store.finish([outcome(done, "ok")], T0 + 10) == ["done"]
    assert await store.finish([outcome(permanent, "permanent", error=None)], T0 + 20) == ["dead"]
    await store.cancel("cancelled", T0 + 30, "ops")
    assert await store.finish([outcome(exhausted, "retry")], T0 + 40) == ["dead"]
    assert [t.id for t in await claim(store, "w1", T0 + 1_000)] == ["leased"]  # after sweeping "swept"


async def test_prunable_dates_each_ended_job_by_the_rule(store: QueueStore) -> None:
    # done, permanent and cancelled jobs ended at available_at; deadline and exhausted ones are dated by their
    # deadline (the row does not say whether a finish or the sweep parked it): never before they ended.
    await ended_in_every_way(store)
    before = await dump(store)
    expected = [
        (T0 + 10, {"done": 0, "dead": 0}, []),  # strictly before the cutoff
        (T0 + 11, {"done": 1, "dead": 0}, ["done"]),
        (T0 + 31, {"done": 1, "dead": 2}, ["done", "permanent", "cancelled"]),
        (T0 + 1_001, {"done": 1, "dead": 3}, ["done", "permanent", "cancelled", "swept"]),
        (T0 + 60_001, {"done": 1, "dead": 4}, ["done", "permanent", "exhausted", "cancelled", "swept"]),
    ]
    for cutoff, counts, ids in expected:
        assert await store.prunable(cutoff, ("done", "dead"), -1) == (counts, ids)
    assert await store.prunable(T0 + 60_001, ("dead",), 2) == ({"done": 0, "dead": 4}, ["permanent", "exhausted"])
    assert await store.prunable(T0 + 60_001, ("done",), 0) == ({"done": 1, "dead": 0}, [])
    expect(before, await dump(store))


async def test_prune_deletes_the_prunable_jobs_of_the_named_statuses_and_keeps_the_audit(store: QueueStore) -> None:
    await ended_in_every_way(store)
    before = await dump(store)
    assert (await store.prune(T0 + 1_001, ("dead",), vacuum=False, now_ms=T0 + 1_001))["deleted"] == 3
    after = await dump(store)
    expect(before, after, {"permanent": None, "cancelled": None, "swept": None})  # the cancel's audit row stays
    assert (await store.prune(T0 + 1_001, ("dead",), vacuum=True, now_ms=T0 + 1_001))["deleted"] == 0
    expect(after, await dump(store))
    assert (await store.prune(T0 + 1_001, ("done",), vacuum=True, now_ms=T0 + 1_001))["deleted"] == 1
    expect(after, await dump(store), {"done": None})
    assert await store.prunable(T0 + 60_001, ("done", "dead"), -1) == ({"done": 0, "dead": 1}, ["exhausted"])


async def test_prune_takes_the_errors_of_the_jobs_it_deletes_only(store: QueueStore) -> None:
    await enqueue(store, new("a", max_attempts=1), new("kept"))
    a, kept = await claim(store, "w1", T0, n=2)
    finishes = [outcome(a, "retry", error=BOOM), outcome(kept, "retry", 100, error=BOOM)]
    assert await store.finish(finishes, T0 + 1) == ["dead", "pending"]
    before = await dump(store)
    assert [len(job.errors) for job in before.jobs.values()] == [1, 1]
    assert (await store.prune(T0 + 60_001, ("dead",), vacuum=False, now_ms=T0 + 60_001))["deleted"] == 1
    expect(before, await dump(store), {"a": None})  # "kept" keeps its error
    pruned = await dump(store)
    again = await enqueue(store, new("a", T0 + 70_000, body={"v": 2}))  # a new job: a new seq, no errors
    expect(pruned, await dump(store), again)
    assert again["a"].errors == () and again["a"].seq > a.seq


async def test_an_id_enqueued_again_after_prune_has_not_been_redriven(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, "permanent")], T0 + 1) == ["dead"]
    await store.redrive("a", T0 + 2, T0 + 3, "ops")
    assert [t.id for t in await claim(store, "w1", T0 + 3)] == []  # swept: deadline
    assert (await store.prune(T0 + 4, ("dead",), vacuum=False, now_ms=T0 + 4))["deleted"] == 1
    await store.enqueue([new("a", T0 + 5, body={"v": 2})])
    job = await store.get("a")
    assert job is not None and job.redrives == 0


async def test_describe_names_the_store_and_its_schema_version(store: QueueStore, driver: Driver) -> None:
    found = await store.describe()
    assert found["store"] == driver.kind
    assert isinstance(found["schema_version"], int) and found["schema_version"] >= 1
    assert found["survives_power_loss"] is driver.capabilities.survives_power_loss
    assert found == await store.describe()  # a read: describing changes nothing


async def test_capabilities_are_the_drivers(store: QueueStore, driver: Driver) -> None:
    assert store.capabilities == driver.capabilities
    assert isinstance(store.location, str) and store.location


async def test_a_read_only_handle_reads_everything_and_refuses_every_write(store: QueueStore, driver: Driver) -> None:
    await ended_in_every_way(store)
    before = await dump(store)
    reader = await driver.open_read_only(store)
    try:
        assert reader.capabilities == replace(driver.capabilities, read_only=True)
        assert await dump(reader) == before
        assert (await reader.describe())["store"] == driver.kind
        [leased] = await reader.list_jobs(JobFilter(status="leased"))
        fence = (leased.owner, leased.token, leased.attempts, leased.lease_until)
        writes = [
            lambda: reader.enqueue([new("new")]),
            lambda: reader.settle_and_claim([], T0 + 1_000, "w9", 1_000, [("default", 1)], None),
            lambda: reader.extend([("leased", fence)], T0 + 1_001, 1_000),  # type: ignore[list-item]
            lambda: reader.release([("leased", fence)], T0 + 1_001),  # type: ignore[list-item]
            lambda: reader.redrive("permanent", T0 + 1_001, T0 + 9_000, "ops"),
            lambda: reader.cancel("pending", T0 + 1_001, "ops"),
            lambda: reader.prune(T0 + 60_001, ("done", "dead"), vacuum=False, now_ms=T0 + 60_001),
        ]
        for write in writes:
            with pytest.raises(StoreError):
                await write()
        with pytest.raises(StoreError):
            async with reader.transaction():
                pass
    finally:
        await reader.close()
    expect(before, await dump(store))


async def test_a_backup_opens_as_the_same_store(store: QueueStore, driver: Driver, tmp_path: Path) -> None:
    if not store.capabilities.backup:
        with pytest.raises(NotImplementedError):
            await store.backup(str(tmp_path / "copy"), force=False)
        return
    await ended_in_every_way(store)
    before = await dump(store)
    done = await store.backup(str(tmp_path / "copy.db"), force=False)
    assert done["jobs"] == {"pending": 1, "leased": 1, "done": 1, "dead": 4}
    copy = await driver.open_backup(done["path"])
    try:
        assert await dump(copy) == before
    finally:
        await copy.close()
    expect(before, await dump(store))
