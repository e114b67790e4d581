"""Unique while active (docs/flow-control.md), through the port and the facade on every driver, the whole state
checked: while a job of a queue with a unique key is pending (delayed included) or leased, another job with that key
is not inserted (the answer is the holder's id, or ``UniqueConflict`` with ``on_conflict="raise"``); a retry keeps
the key its job holds; once the job ends the key is free; a redrive whose key is taken is a typed refusal that
changes nothing; the id stays the idempotency key."""

from __future__ import annotations

from typing import Any

import pytest

from asyncq.core.jobs import JobSpec
from asyncq.core.lifecycle import UNIQUE_WHILE
from asyncq.errors import Conflict, UniqueConflict
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome, stored

pytestmark = pytest.mark.timeout(30)


def test_the_statuses_that_hold_a_key_are_the_active_ones() -> None:
    assert UNIQUE_WHILE == ("pending", "leased", "waiting")  # a waiting job will run: docs/dependencies.md


async def test_a_second_job_with_the_key_while_one_is_pending_answers_with_its_id(store: QueueStore) -> None:
    jobs = await enqueue(store, new("a", unique_key="digest:42"))
    assert jobs["a"] == stored(new("a", unique_key="digest:42"), jobs["a"].seq)
    assert jobs["a"].unique_key == "digest:42"
    before = await dump(store)
    assert await store.enqueue([new("b", unique_key="digest:42")]) == ["a"]
    expect(before, await dump(store))  # nothing inserted
    # The same id and payload again is still the id's rule: False, not the holder.
    assert await store.enqueue([new("a", unique_key="digest:42")]) == [False]


async def test_a_delayed_job_is_pending_and_holds_its_key(store: QueueStore) -> None:
    await enqueue(store, new("later", delay_ms=5_000, unique_key="k"))
    assert await store.enqueue([new("now", unique_key="k")]) == ["later"]


async def test_a_leased_job_holds_its_key_and_keeps_it_through_a_retry(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.enqueue([new("b", unique_key="k")]) == ["a"]
    assert await store.finish([outcome(ticket, "retry", 10)], T0 + 5) == ["pending"]  # leased -> pending: no clash
    assert await store.enqueue([new("c", unique_key="k")]) == ["a"]
    [again] = await claim(store, "w1", T0 + 20)
    assert await store.release([("a", again.fence)], T0 + 21) == [True]  # a release keeps it too
    assert await store.enqueue([new("d", unique_key="k")]) == ["a"]
    assert sorted((await dump(store, T0 + 21)).jobs) == ["a"]


async def test_the_key_is_per_queue_and_distinct_from_the_id(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"), new("b", queue="other", unique_key="k"), new("c"), new("d"))
    assert await store.enqueue([new("e", unique_key="other-key")]) == [True]


async def test_raise_mode_raises_unique_conflict_naming_the_holder_and_inserts_nothing(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    before = await dump(store)
    with pytest.raises(UniqueConflict) as raised:
        await store.enqueue([new("fresh"), new("b", unique_key="k", on_conflict="raise")])
    assert (raised.value.existing_id, raised.value.unique_key, raised.value.queue) == ("a", "k", "default")
    assert raised.value.job_id == "b" and isinstance(raised.value, Conflict)
    expect(before, await dump(store))  # all or nothing: "fresh" was taken back too
    await assert_no_transaction_left(store)


async def test_the_same_id_with_another_key_is_a_conflict(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    with pytest.raises(Conflict) as raised:
        await store.enqueue([new("a", unique_key="other")])
    assert not isinstance(raised.value, UniqueConflict)
    with pytest.raises(Conflict):
        await store.enqueue([new("a")])


@pytest.mark.parametrize("end", ["ok", "permanent"])
async def test_the_key_is_free_once_the_job_ends(store: QueueStore, end: str) -> None:
    await enqueue(store, new("a", unique_key="k"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, end)], T0 + 5) == ["done" if end == "ok" else "dead"]
    assert await store.enqueue([new("b", unique_key="k")]) == [True]
    assert await store.enqueue([new("c", unique_key="k")]) == ["b"]


async def test_a_cancelled_job_frees_its_key(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    assert (await store.cancel("a", T0 + 1, "not needed")).state == "cancelled"
    assert await store.enqueue([new("b", unique_key="k")]) == [True]


async def test_a_redrive_whose_key_is_taken_is_a_typed_conflict_that_changes_nothing(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, "permanent")], T0 + 5) == ["dead"]
    assert await store.enqueue([new("b", unique_key="k")]) == [True]
    before = await dump(store, T0 + 10)
    with pytest.raises(UniqueConflict) as raised:
        await store.redrive("a", T0 + 10, T0 + 60_000, "try again")
    assert (raised.value.existing_id, raised.value.job_id, raised.value.unique_key) == ("b", "a", "k")
    expect(before, await dump(store, T0 + 10))  # same rows, no audit row
    await assert_no_transaction_left(store)
    # Once b ends, the redrive takes the key again; then a new job with it answers with a's id.
    [held] = await claim(store, "w1", T0 + 20)
    assert await store.finish([outcome(held, "ok")], T0 + 25) == ["done"]
    entry = await store.redrive("a", T0 + 30, T0 + 60_000, "try again")
    assert entry.action == "redrive"
    assert await store.enqueue([new("c", unique_key="k")]) == ["a"]


async def test_a_redrive_of_a_dead_job_whose_key_is_free_takes_it(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    assert (await store.cancel("a", T0 + 1, "oops")).state == "cancelled"
    await store.redrive("a", T0 + 2, T0 + 60_000, "back")
    assert await store.enqueue([new("b", unique_key="k")]) == ["a"]


async def test_two_jobs_sharing_a_key_in_one_batch_the_second_answers_with_the_first(store: QueueStore) -> None:
    rows = [new("x1", unique_key="k"), new("plain"), new("x2", unique_key="k"), new("y", unique_key="other")]
    assert await store.enqueue(rows) == [True, True, "x1", True]
    assert sorted((await dump(store)).jobs) == ["plain", "x1", "y"]
    many = [new(f"m{n}", unique_key=f"key-{n % 7}") for n in range(300)]  # past one statement's batch
    results = await store.enqueue(many)
    assert results[:7] == [True] * 7
    assert results[7:] == [f"m{n % 7}" for n in range(7, 300)]


async def test_a_batch_that_raises_on_its_own_earlier_row_inserts_nothing(store: QueueStore) -> None:
    before = await dump(store)
    with pytest.raises(UniqueConflict) as raised:
        await store.enqueue([new("x1", unique_key="k"), new("x2", unique_key="k", on_conflict="raise")])
    assert raised.value.existing_id == "x1"
    expect(before, await dump(store))


async def test_inside_a_transaction_the_answer_is_the_holder(store: QueueStore) -> None:
    await enqueue(store, new("a", unique_key="k"))
    async with store.transaction() as tx:
        assert await tx.enqueue_rows([new("b", unique_key="k"), new("c", unique_key="k2")]) == ["a", True]
    assert sorted((await dump(store)).jobs) == ["a", "c"]


BAD_KEYS: list[tuple[Any, type[Exception]]] = [
    (42, TypeError),
    (b"k", TypeError),
    ("", ValueError),
    (" k", ValueError),
    ("k\n", ValueError),
    ("a\x00b", ValueError),
    ("k" * 201, ValueError),
]


@pytest.mark.parametrize(("key", "error"), BAD_KEYS)
async def test_invalid_keys_are_refused_before_any_change(store: QueueStore, key: Any, error: type[Exception]) -> None:
    queue = Queue(store, clock=lambda: T0)
    await enqueue(store, new("a", unique_key="k"))
    before = await dump(store)
    with pytest.raises(error, match="unique_key"):
        await queue.enqueue("b", {}, unique_key=key)
    with pytest.raises(error, match="unique_key"):
        await queue.enqueue_many([JobSpec("c", {}), JobSpec("d", {}, unique_key=key)])
    with pytest.raises(error, match="unique_key"):
        async with queue.transaction() as tx:
            await tx.enqueue("e", {}, unique_key=key)
    with pytest.raises(ValueError, match="on_conflict"):
        await queue.enqueue("f", {}, unique_key="k", on_conflict="ignore")  # type: ignore[arg-type]
    expect(before, await dump(store))


async def test_the_facade_answers_with_the_holder_and_raises_on_request(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    assert await queue.enqueue("a", {"n": 1}, unique_key="digest:42") is True
    assert await queue.enqueue("b", {"n": 2}, unique_key="digest:42") == "a"
    with pytest.raises(UniqueConflict):
        await queue.enqueue("c", {"n": 3}, unique_key="digest:42", on_conflict="raise")
    assert await queue.enqueue_many([JobSpec("d", {}, unique_key="digest:42")]) == ["a"]
    async with queue.transaction() as tx:
        assert await tx.enqueue("e", {}, unique_key="digest:42") == "a"
    job = await queue.get("a")
    assert job is not None and job.unique_key == "digest:42"
    assert [(j.id, j.unique_key) for j in await queue.list_jobs()] == [("a", "digest:42")]
