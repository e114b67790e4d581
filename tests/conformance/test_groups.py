"""Groups on each driver (docs/dependencies.md): members enqueued with ``group=``, counted as they end; a seal stores
the callback waiting; the transaction that ends the last member of a sealed group (or seals a group whose members
have all ended) completes it once and releases the callback with the outcome in its body; retention keeps what an
open group needs."""

from __future__ import annotations

import asyncio

import pytest
from drivers import Driver

from asyncq.core.groups import GroupOutcome, group_callback_id
from asyncq.core.jobs import JobSpec
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.port.graphs import GroupFilter
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, new, outcome

pytestmark = pytest.mark.timeout(60)


def callback(group: str, **options: object) -> JobSpec:
    return JobSpec(group_callback_id(group), {"task": "summarize", "args": {"note": "n"}}, queue="reports", **options)  # type: ignore[arg-type]


async def finish_all(store: QueueStore, now: int, results: dict[str, str]) -> dict[str, str | None]:
    """Claim every ready job of the default queue and finish each with its result (``ok`` by default): the status
    each one's finish left, by id."""
    tickets = await claim(store, "w1", now, n=50)
    statuses = await store.finish([outcome(t, results.get(t.id, "ok")) for t in tickets], now)
    return {ticket.id: status for ticket, status in zip(tickets, statuses, strict=True)}


async def test_the_last_member_to_end_releases_the_callback_once_with_the_outcome(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    async with queue.transaction() as tx:
        for n in range(4):
            await tx.enqueue(f"row-{n}", {"n": n}, group="import-1")
        sealed = await tx.seal_group("import-1", callback=callback("import-1", priority=3))
    assert (sealed.members, sealed.sealed_at, sealed.completed_at, sealed.callback_status) == (4, T0, None, "waiting")
    tickets = await claim(store, "w1", T0 + 1, n=10)
    assert len(tickets) == 4 and await claim(store, "w1", T0 + 1, queue="reports") == []
    first = await store.finish([outcome(t, "permanent" if t.id == "row-1" else "ok") for t in tickets[:3]], T0 + 2)
    assert first == ["done", "dead", "done"]
    assert await claim(store, "w1", T0 + 3, queue="reports") == []  # never early
    group = await queue.group("import-1")
    assert group is not None and (group.done, group.dead, group.running, group.complete) == (2, 1, 1, False)
    statuses, tickets, *_ = await store.settle_and_claim(
        [outcome(tickets[3], "ok")], T0 + 4, "w1", 1_000, [("reports", 5)], None
    )
    assert statuses == ["done"] and [t.id for t in tickets] == ["group-import-1"]  # released in that same commit
    assert tickets[0].priority == 3 and tickets[0].body == {
        "task": "summarize", "args": {"note": "n", "group": {"name": "import-1", "members": 4, "done": 3, "dead": 1}},
    }  # fmt: skip
    group = await queue.group("import-1")
    assert group is not None and (group.completed_at, group.outcome) == (T0 + 4, GroupOutcome("import-1", 4, 3, 1))
    dead = await queue.group_members("import-1", status="dead")
    assert [job.id for job in dead] == ["row-1"]


async def test_a_seal_after_every_member_ended_completes_the_group_in_its_own_transaction(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 10)
    await store.enqueue([new("m1", group="g"), new("m2", group="g")])
    await finish_all(store, T0 + 5, {})
    assert (await queue.group("g")) is not None and await queue.open_groups() == 1
    sealed = await queue.seal_group("g", callback=callback("g"))
    assert (sealed.completed_at, sealed.callback_status, sealed.outcome) == (
        T0 + 10,
        "pending",
        GroupOutcome("g", 2, 2, 0),
    )
    assert await queue.open_groups() == 0
    empty = await queue.seal_group("nobody", callback=callback("nobody"))  # no member at all: complete at once
    assert (empty.members, empty.completed_at, empty.callback_status) == (0, T0 + 10, "pending")
    bare = await queue.seal_group("no-callback")
    assert (bare.callback_id, bare.complete) == (None, True)


async def test_sealing_refuses_new_members_and_twice_changes_nothing(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await store.enqueue([new("m1", group="g")])
    await queue.seal_group("g", callback=callback("g"))
    before = await dump(store)
    again = await queue.seal_group("g", callback=callback("g", priority=9))
    assert again.sealed_at == T0 and await dump(store) == before
    with pytest.raises(ValueError, match="sealed"):
        await store.enqueue([new("m2", group="g"), new("other")])
    with pytest.raises(ValueError, match="sealed"):
        async with queue.transaction() as tx:
            await tx.enqueue("m3", {}, group="g")
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_a_callback_id_taken_or_a_bad_callback_is_refused_before_the_seal(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await enqueue(store, new("group-taken"))
    await store.enqueue([new("m", group="taken")])
    before = await dump(store)
    with pytest.raises(Conflict, match="taken by another job"):
        await queue.seal_group("taken", callback=callback("taken"))
    with pytest.raises(ValueError, match="must have the id 'group-taken'"):
        await queue.seal_group("taken", callback=JobSpec("other", {}))
    with pytest.raises(ValueError, match="JSON object"):
        await queue.seal_group("taken", callback=JobSpec("group-taken", [1]))
    with pytest.raises(ValueError, match="group must be"):
        await queue.seal_group("x" * 59)
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_a_member_redriven_before_completion_is_counted_again_and_after_it_nowhere(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 20)
    await store.enqueue([new("m1", group="g"), new("m2", group="g"), new("m3", group="g")])
    await queue.seal_group("g", callback=callback("g"))
    [t1] = await claim(store, "w1", T0 + 1)
    await store.finish([outcome(t1, "permanent")], T0 + 1)
    await queue.redrive("m1", "fixed")  # before completion: no longer counted dead
    group = await queue.group("g")
    assert group is not None and (group.done, group.dead, group.running) == (0, 0, 3)
    assert await finish_all(store, T0 + 30, {"m2": "permanent"}) == {"m1": "done", "m2": "dead", "m3": "done"}
    group = await queue.group("g")
    assert group is not None and group.outcome == GroupOutcome("g", 3, 2, 1)
    await queue.redrive("m2", "after the callback")  # after completion: the counters stand still
    assert await finish_all(store, T0 + 40, {}) == {"m2": "done"}
    assert await queue.group("g") == group
    assert [t.id for t in await claim(store, "w1", T0 + 50, queue="reports", n=5)] == ["group-g"]  # one callback


async def test_groups_are_listed_with_their_progress(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await store.enqueue([new("a1", group="a"), new("b1", group="b"), new("b2", group="b")])
    await queue.seal_group("b", callback=callback("b"))
    listed = await queue.groups()
    assert [(g.name, g.members, g.sealed) for g in listed] == [("a", 1, False), ("b", 2, True)]
    assert [g.name for g in await queue.groups(after="a")] == ["b"]
    await finish_all(store, T0 + 1, {})
    assert [g.name for g in await store.groups(GroupFilter(open_only=True))] == ["a"]
    members = await queue.group_members("b")
    assert [(job.id, job.status, job.group) for job in members] == [("b1", "done", "b"), ("b2", "done", "b")]
    assert (await store.waits_for(["group-b"]))["group-b"].group == "b"


async def test_retention_keeps_members_until_the_callback_ended(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 10_000)
    await store.enqueue([new("m1", group="g"), new("m2", group="g")])
    await queue.seal_group("g", callback=JobSpec(group_callback_id("g"), {}))
    await finish_all(store, T0 + 1, {})
    await queue.set_retention("default", done=1)
    assert (await queue.prunable(1)).ids == []  # the callback has not run: it may read its members
    assert (await queue.apply_retention()).total == 0
    [cb] = await claim(store, "w1", T0 + 10_000)  # released when m2 ended, ready from its seal's time
    await store.finish([outcome(cb, "ok")], T0 + 10_000)
    assert sorted((await queue.prunable(1)).ids) == ["m1", "m2"]  # (the callback itself ended just now)


async def test_the_last_two_members_ended_by_two_handles_at_once_complete_the_group_once(
    store: QueueStore, driver: Driver
) -> None:
    queue = Queue(store, clock=lambda: T0)
    await store.enqueue([new(f"m{n}", group="g") for n in range(6)])
    await queue.seal_group("g", callback=callback("g"))
    other = await driver.open_another(store)
    try:
        for _ in range(3):
            tickets = await claim(store, "w1", T0 + 1, n=2)
            assert len(tickets) == 2
            done = await asyncio.gather(
                store.finish([outcome(tickets[0], "ok")], T0 + 2), other.finish([outcome(tickets[1], "ok")], T0 + 2)
            )
            assert done == [["done"], ["done"]]
        group = await queue.group("g")
        assert group is not None and group.outcome == GroupOutcome("g", 6, 6, 0) and group.callback_status == "pending"
        assert len(await claim(store, "w1", T0 + 3, queue="reports", n=5)) == 1
    finally:
        await other.close()


async def test_a_member_ended_by_its_dependency_counts_dead_and_a_cancelled_callback_runs_only_if_redriven(
    store: QueueStore,
) -> None:
    queue = Queue(store, clock=lambda: T0)
    await store.enqueue([new("a"), new("m1", group="g", after=["a"]), new("m2", group="g")])
    await queue.seal_group("g", callback=callback("g"))
    assert (await queue.cancel(group_callback_id("g"), "not now")).state == "cancelled"
    [ta] = await claim(store, "w1", T0 + 1)
    await store.finish([outcome(ta, "permanent")], T0 + 1)  # m1 ends dead (dependency): the group counts it
    assert await finish_all(store, T0 + 2, {}) == {"m2": "done"}
    group = await queue.group("g")
    assert group is not None and group.outcome == GroupOutcome("g", 2, 1, 1) and group.callback_status == "dead"
    job = await store.get(group_callback_id("g"))
    assert job is not None and (job.status, job.waits, job.body["args"]["group"]["dead"]) == ("dead", 0, 1)
    assert await claim(store, "w1", T0 + 3, queue="reports") == []
    await queue.redrive(group_callback_id("g"), "run it after all")
    assert [t.id for t in await claim(store, "w1", T0 + 3, queue="reports")] == ["group-g"]
