"""Enqueue through the port: a new row is stored whole; the same id with the same payload is ``False`` and keeps
its row whole, whatever its state; another payload is ``Conflict`` and changes nothing; a batch is all or none;
``transaction()`` keeps the app's statements and the jobs together, or none of them."""

from __future__ import annotations

import asyncio

import pytest
from drivers import Driver

from asyncq.errors import Conflict
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, expect, new, outcome, stored

pytestmark = pytest.mark.timeout(30)


async def test_new_rows_are_stored_whole_in_batch_order(store: QueueStore) -> None:
    rows = [
        new("a", queue="mail", body={"n": [1, "two"]}, max_attempts=5, ttl_ms=60_000, delay_ms=2_000),
        new("b", T0 + 7, max_attempts=1, ttl_ms=1),
        new("c", T0 - 5),  # an earlier now: still the newest seq
    ]
    before = await dump(store)
    assert await store.enqueue(rows) == [True, True, True]
    after = await dump(store)
    seqs = [job.seq for job in after.jobs.values()]
    assert list(after.jobs) == ["a", "b", "c"] and seqs == sorted(seqs)
    expect(before, after, {row.id: stored(row, seq) for row, seq in zip(rows, seqs, strict=True)})
    assert after.jobs["a"].available_at == T0 + 2_000 and after.jobs["a"].deadline == T0 + 60_000


async def test_a_batch_mixing_plain_jobs_with_ones_that_set_a_column_stores_each_as_given(store: QueueStore) -> None:
    # A store may write only the columns some job of a statement sets (SQLite: ``Layout.defaults``): one job setting
    # a column must not lend it to the others, nor lose it beside them; a batch of plain jobs alone, nor them.
    task_body = {"task": "mail.send", "args": {"to": "ada"}}
    rows = [
        new("plain", body={"n": 1}),
        new("task", body=task_body),
        new("urgent", priority=7),
        new("keyed", unique_key="once", limit_key="tenant-1"),
        new("low-task", body=task_body | {"args": {"to": "bob"}}, priority=-2),
        new("plain-after", body={"n": 2}),
    ]
    plain_only = [new("plain-batch", body={"n": 3}), new("plain-batch-2", body={"n": 4})]
    before = await dump(store)
    assert await store.enqueue(rows) == [True] * len(rows)
    assert await store.enqueue(plain_only) == [True, True]
    after = await dump(store)
    added = [*rows, *plain_only]
    expect(before, after, {row.id: stored(row, after.jobs[row.id].seq) for row in added})
    assert after.jobs["task"].task == "mail.send" and after.jobs["plain"].task is None
    assert after.jobs["urgent"].priority == 7 and after.jobs["plain-after"].priority == 0
    assert (after.jobs["keyed"].unique_key, after.jobs["keyed"].limit_key) == ("once", "tenant-1")
    assert after.jobs["plain-batch"].unique_key is None and after.jobs["plain-batch"].limit_key is None
    # The same ids and payloads again are known (False), whatever columns each statement wrote.
    assert await store.enqueue(added) == [False] * len(added)


async def leased_done_and_dead(store: QueueStore) -> None:
    """One job in each state: pending (p), leased (l), done (d), dead (x)."""
    assert await store.enqueue([new(job_id) for job_id in ("l", "d", "x", "p")]) == [True] * 4
    leased, done, dead = await claim(store, "w1", T0, n=3)
    assert await store.finish([outcome(done, "ok"), outcome(dead, "permanent")], T0 + 1) == ["done", "dead"]
    assert leased.id == "l"


async def test_the_same_id_with_the_same_payload_is_false_and_keeps_its_row_whole(store: QueueStore) -> None:
    await leased_done_and_dead(store)
    before = await dump(store)
    # Everything but the payload differs: budget, availability and deadline are the stored row's, not these.
    again = [new(job_id, T0 + 5_000, max_attempts=9, ttl_ms=1_000, delay_ms=500) for job_id in ("p", "l", "d", "x")]
    assert await store.enqueue(again) == [False] * 4
    expect(before, await dump(store))


@pytest.mark.parametrize("job_id", ["p", "l", "d", "x"])
async def test_the_same_id_with_another_payload_is_a_conflict_and_changes_nothing(
    store: QueueStore, job_id: str
) -> None:
    await leased_done_and_dead(store)
    before = await dump(store)
    with pytest.raises(Conflict, match=job_id):
        await store.enqueue([new(job_id, body={"other": 1})])
    with pytest.raises(Conflict, match=job_id):  # the same body on another queue is another job
        await store.enqueue([new(job_id, queue="other")])
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_batch_with_one_conflict_inserts_none_of_it(store: QueueStore) -> None:
    await store.enqueue([new("existing")])
    before = await dump(store)
    with pytest.raises(Conflict, match="existing"):
        await store.enqueue([new("new-1"), new("existing", body={"v": 2}), new("new-2")])
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_batch_reports_each_job_and_a_repeat_in_it_is_the_same_job(store: QueueStore) -> None:
    await store.enqueue([new("old")])
    before = await dump(store)
    rows = [new("old"), new("new"), new("new", T0 + 9, max_attempts=7)]
    assert await store.enqueue(rows) == [False, True, False]
    after = await dump(store)
    expect(before, after, {"new": stored(rows[1], after.jobs["new"].seq)})  # the first of the repeats is kept


async def test_a_repeat_with_another_payload_in_one_batch_is_a_conflict(store: QueueStore) -> None:
    before = await dump(store)
    with pytest.raises(Conflict, match="twin"):
        await store.enqueue([new("twin", body={"v": 1}), new("other"), new("twin", body={"v": 2})])
    expect(before, await dump(store))


async def test_a_large_batch_reports_each_job_in_order(store: QueueStore) -> None:
    known = (5, 300, 599)
    await store.enqueue([new(f"job-{n:03d}") for n in known])
    assert await store.enqueue([new(f"job-{n:03d}") for n in range(600)]) == [n not in known for n in range(600)]
    after = await dump(store, deep=False)
    order = [*known, *(n for n in range(600) if n not in known)]  # seq follows the batches
    assert list(after.jobs) == [f"job-{n:03d}" for n in order]
    assert all(job == stored(new(job.id), job.seq) for job in after.jobs.values())


async def test_a_conflict_late_in_a_large_batch_rolls_back_every_row_before_it(store: QueueStore) -> None:
    await store.enqueue([new("job-500")])
    before = await dump(store)
    batch = [new(f"job-{n:03d}", body={"v": -1} if n == 500 else None) for n in range(600)]
    with pytest.raises(Conflict, match="job-500"):
        await store.enqueue(batch)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


# -- transaction(): the app's statements and the jobs together ---------------------------------------------


def needs_app_sql(driver: Driver) -> None:
    if not driver.capabilities.app_sql:
        pytest.skip(f"{driver.name} runs no app statements")


async def orders(store: QueueStore) -> list[tuple[str, int]]:
    async with store.transaction() as tx:
        return [tuple(row) for row in await tx.execute("SELECT id, total FROM orders ORDER BY id")]


async def make_orders(store: QueueStore) -> None:
    async with store.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")


async def test_a_transaction_commits_the_apps_rows_and_its_jobs_together(store: QueueStore, driver: Driver) -> None:
    needs_app_sql(driver)
    await make_orders(store)
    await store.enqueue([new("old")])
    before = await dump(store)
    async with store.transaction() as tx:
        await tx.execute("INSERT INTO orders VALUES ('o1', 100)")
        assert await tx.enqueue_rows([new("mail-o1"), new("old")]) == [True, False]
        assert await tx.enqueue_rows([new("mail-o1")]) == [False]  # its own row, seen inside the transaction
        with pytest.raises(Conflict):
            await tx.enqueue_rows([new("old", body={"v": 2})])
        assert await tx.execute("SELECT count(*) FROM orders") == [(1,)]
    after = await dump(store)
    assert await orders(store) == [("o1", 100)]
    expect(before, after, {"mail-o1": stored(new("mail-o1"), after.jobs["mail-o1"].seq)})


async def test_a_transaction_whose_block_raises_keeps_nothing(store: QueueStore, driver: Driver) -> None:
    needs_app_sql(driver)
    await make_orders(store)
    before = await dump(store)
    with pytest.raises(RuntimeError, match="payment declined"):
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES ('o1', 100)")
            await tx.enqueue_rows([new("mail-o1")])
            raise RuntimeError("payment declined")
    with pytest.raises(Conflict):  # a conflict inside the block takes the rows before it along
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES ('o2', 5)")
            await tx.enqueue_rows([new("mail-o2")])
            await tx.enqueue_rows([new("mail-o2", body={"v": "other"})])
    expect(before, await dump(store))
    assert await orders(store) == []
    await assert_no_transaction_left(store)


async def test_a_transaction_cancelled_inside_its_block_keeps_nothing(store: QueueStore) -> None:
    before = await dump(store)
    inside = asyncio.Event()

    async def hold() -> None:
        async with store.transaction() as tx:
            await tx.enqueue_rows([new("never")])
            inside.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(hold())
    async with asyncio.timeout(5):
        await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_waiting_workers_wake_when_rows_commit_not_before(store: QueueStore) -> None:
    waiter = asyncio.create_task(store.wait_for_work(10))
    await asyncio.sleep(0)  # one loop step: the waiter is registered
    async with store.transaction() as tx:
        await tx.enqueue_rows([new("job")])
        await asyncio.sleep(0)
        assert not waiter.done()
    async with asyncio.timeout(2):
        await waiter
    woken = asyncio.create_task(store.wait_for_work(10))
    await asyncio.sleep(0)
    await store.enqueue([new("second")])
    async with asyncio.timeout(2):
        await woken
    async with asyncio.timeout(2):  # with nothing committed, the timeout ends the wait
        await store.wait_for_work(0.01)


async def make_ready(store: QueueStore, how: str) -> None:
    """Job ``a`` ready now by way of ``how``, from a lease (or a dead job) that was not."""
    if how == "redrive":
        await store.redrive("a", T0 + 2, T0 + 60_000, "ops")
        return
    [ticket] = await claim(store, "w1", T0 + 1)
    if how == "release":
        assert await store.release([("a", ticket.fence)], T0 + 2) == [True]
    else:
        assert await store.finish([outcome(ticket, "retry", 0)], T0 + 2) == ["pending"]


@pytest.mark.parametrize(
    "how",
    [
        "release",
        "redrive",
        "retry-due-now",
    ],
)
async def test_a_job_made_ready_again_wakes_waiting_workers(store: QueueStore, how: str) -> None:
    await store.enqueue([new("a", max_attempts=3)])
    if how == "redrive":
        [ticket] = await claim(store, "w1", T0)
        assert await store.finish([outcome(ticket, "permanent")], T0 + 1) == ["dead"]
    waiter = asyncio.create_task(store.wait_for_work(10))
    await asyncio.sleep(0)  # one loop step: the waiter is registered
    await make_ready(store, how)
    async with asyncio.timeout(1):  # an in-process wake-up takes microseconds; polling would take the 10 s
        await waiter


# --- a pool's offer of its group commit (``QueueStore.host_rides``) ----------------------------------------------


async def test_an_offer_to_host_rides_never_loses_nor_changes_an_enqueue(store: QueueStore) -> None:
    """A store may put an enqueue in the group commit a pool runs when asked (SQLite), or ignore the offer
    (PostgreSQL). Asked and never running one, the pool must still see every enqueue stored whole, the answers
    those of an enqueue alone, and a refused batch leave nothing; once withdrawn, nothing asks it again."""
    asked: list[int] = []
    withdraw = store.host_rides(lambda: asked.append(1) is None)  # says it will run one, and never does
    rows = [new("a"), new("b", priority=3)]
    before = await dump(store)
    assert await store.enqueue(rows) == [True, True]
    assert await store.enqueue([new("a")]) == [False]
    with pytest.raises(Conflict):
        await store.enqueue([new("c"), new("a", body={"other": 1})])
    after = await dump(store)
    expect(before, after, {row.id: stored(row, after.jobs[row.id].seq) for row in rows})
    withdraw()
    seen = len(asked)
    assert await store.enqueue([new("d")]) == [True]
    assert len(asked) == seen
    await assert_no_transaction_left(store)
