"""The console's actions on jobs in graphs (docs/dependencies.md, docs/console.md) on every driver: a delete never
removes a job a graph still needs (its preview names it, and a set that became needed since is refused); a cancel
ends waiting jobs and settles dependants and groups as every cancel does, counting a member its graph ended in the
same transaction and waking the workers for what it released; a waiting job keeps a new priority when released; a
redrive that its graph refuses changes nothing; what waits for a job is read through the port."""

from __future__ import annotations

import asyncio

import pytest

from asyncq.core.dependencies import Dependency, DependencyState
from asyncq.core.groups import group_callback_id
from asyncq.core.jobs import JobSpec
from asyncq.core.operations import ADMIN, Operation, OperationEntry
from asyncq.core.search import JobQuery
from asyncq.errors import SetChanged
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole, Preview
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


def console_of(store: QueueStore, now: int = T0 + 10) -> OperatorConsole:
    return OperatorConsole(Queue(store, clock=lambda: now))


async def act(console: OperatorConsole, preview: Preview, **more: object) -> OperationEntry:
    operation = Operation(preview.action, preview.count, preview.digest, "ada", ADMIN, "graph-fix", preview.query,
                          **more)  # type: ignore[arg-type]  # fmt: skip
    return await console.operate(operation)


async def a_graph(store: QueueStore) -> None:
    """``dep`` pending with ``w-dead``, ``w-run`` and ``w-wait`` waiting for it (each edge's policy); ``old`` done
    with ``after-old`` done after it; group ``g`` (members ``m1`` done, ``m2`` pending; sealed, its callback
    waiting); ``lone`` done, in no graph."""
    queue = Queue(store, clock=lambda: T0)
    await enqueue(store, new("old"), new("lone"))
    tickets = await claim(store, "w1", T0, n=2)
    assert await store.finish([outcome(t, "ok") for t in tickets], T0 + 1) == ["done", "done"]
    await enqueue(store, new("after-old", T0 + 1, after=["old"]))
    [ticket] = await claim(store, "w1", T0 + 2)
    assert await store.finish([outcome(ticket, "ok")], T0 + 2) == ["done"]
    async with queue.transaction() as tx:
        await tx.enqueue("m1", {"n": 1}, group="g")
        await tx.enqueue("m2", {"n": 2}, group="g")
        await tx.seal_group("g", callback=JobSpec(group_callback_id("g"), {"for": "g"}, queue="reports"))
    [m1] = await claim(store, "w1", T0 + 3)
    assert m1.id == "m1" and await store.finish([outcome(m1, "ok")], T0 + 3) == ["done"]
    await enqueue(store, new("dep", T0 + 4, queue="later"))
    policies = {"w-dead": "dead", "w-run": "run", "w-wait": "wait"}
    await enqueue(store, *(new(job_id, T0 + 4, after=[Dependency("dep", policy)]) for job_id, policy in
                           policies.items()))  # type: ignore[arg-type]  # fmt: skip


async def test_a_delete_spares_what_a_graph_still_needs_and_its_preview_names_it(store: QueueStore) -> None:
    await a_graph(store)
    console = console_of(store)
    found = await console.preview("delete", JobQuery())
    assert [job.id for job in found.sample] == ["old", "lone", "after-old"]  # done, and needed by nothing live
    assert [job.id for job in found.spared] == ["m1", "m2", "dep"] and found.spared_count == 3
    before = await dump(store)
    entry = await act(console, found)
    assert entry.ids == ("old", "lone", "after-old") and entry.outcome == {"deleted": 3}
    after = await dump(store)
    expect(before, after, dict.fromkeys(entry.ids), after.audit[len(before.audit) :])
    alone = await console.preview("delete", JobQuery(ids=("dep",)))
    assert (alone.count, [job.id for job in alone.spared]) == (0, ["dep"])  # a job page offers no delete of it
    for job_id in ("w-dead", "w-run", "w-wait"):  # once nothing live waits for it, it may go
        await store.cancel(job_id, T0 + 20, "not needed")
    freed = await console.preview("delete", JobQuery(ids=("dep", "m1")))
    assert [job.id for job in freed.sample] == ["dep"] and [job.id for job in freed.spared] == ["m1"]
    await act(console, freed)
    assert await store.get("dep") is None
    waits = await Queue(store, clock=lambda: T0).waits_for("w-dead")
    assert waits is not None and waits.dependencies == ()  # its edge went with its dependency


async def test_a_set_that_a_graph_came_to_need_since_its_preview_is_refused(store: QueueStore) -> None:
    await enqueue(store, new("dep"), new("other"))
    console = console_of(store)
    found = await console.preview("delete", JobQuery())
    assert found.count == 2 and not found.spared
    await enqueue(store, new("needs-dep", T0 + 1, after=["dep"]))  # dep is needed now
    before = await dump(store)
    with pytest.raises(SetChanged, match="2 confirmed, 1 now"):
        await act(console, found)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_bulk_cancel_settles_its_graph_counts_what_it_ended_and_wakes_workers(store: QueueStore) -> None:
    await a_graph(store)
    console = console_of(store)
    found = await console.preview("cancel", JobQuery(ids=("dep", "w-dead", "m2")))
    assert [job.id for job in found.sample] == ["m2", "dep", "w-dead"]
    waiter = asyncio.create_task(store.wait_for_work(10))
    await asyncio.sleep(0)  # one loop step: the waiter is registered
    entry = await act(console, found)
    assert entry.outcome == {"cancelled": 2, "requested": 0, "requested before": 0, "ended by its graph": 1}
    async with asyncio.timeout(1):  # w-run and the group's callback were released: woken, not polled (10 s)
        await waiter
    jobs = {job_id: await store.get(job_id) for job_id in ("w-dead", "w-run", "w-wait", group_callback_id("g"))}
    assert {job_id: (job.status, job.reason) for job_id, job in jobs.items() if job} == {
        "w-dead": ("dead", "dependency"), "w-run": ("pending", None), "w-wait": ("waiting", None),
        group_callback_id("g"): ("pending", None)}  # fmt: skip
    cancelled = [row for row in (await dump(store)).audit if row.op_seq == entry.seq]
    assert [(row.id, row.action) for row in cancelled] == [("m2", "cancel"), ("dep", "cancel")]


async def test_a_waiting_job_is_cancelled_at_once_and_keeps_a_new_priority_when_released(store: QueueStore) -> None:
    await a_graph(store)
    console = console_of(store)
    found = await console.preview("priority", JobQuery(status="waiting", queue="default"))
    assert [job.id for job in found.sample] == ["w-dead", "w-run", "w-wait"]
    assert (await act(console, found, priority=9)).outcome == {"changed": 3}
    cancel = await console.preview("cancel", JobQuery(ids=("w-wait",)))
    assert (await act(console, cancel)).outcome == {"cancelled": 1, "requested": 0, "requested before": 0}
    [ticket] = await claim(store, "w1", T0 + 20, queue="later")
    assert await store.finish([outcome(ticket, "ok")], T0 + 21) == ["done"]  # dep done: releases the others
    tickets = await claim(store, "w1", T0 + 22, n=5)
    assert sorted((t.id, t.priority) for t in tickets) == [("m2", 0), ("w-dead", 9), ("w-run", 9)]
    wait = await store.get("w-wait")
    assert wait is not None and (wait.status, wait.reason, wait.priority) == ("dead", "cancelled", 9)


async def test_a_redrive_its_graph_refuses_changes_nothing_and_what_waits_for_a_job_is_read(store: QueueStore) -> None:
    await a_graph(store)
    [ticket] = await claim(store, "w1", T0 + 5, queue="later")
    assert await store.finish([outcome(ticket, "permanent")], T0 + 6) == ["dead"]  # w-dead follows it, dead
    console = console_of(store)
    assert await console.dependants("dep") == (
        [DependencyState("w-dead", "dead", "dead", "failed"), DependencyState("w-run", "pending", "run", "met"),
         DependencyState("w-wait", "waiting", "wait", "open")], False)  # fmt: skip
    assert await console.dependants("dep", limit=1) == ([DependencyState("w-dead", "dead", "dead", "failed")], True)
    assert await console.dependants("lone") == ([], False)
    found = await console.preview("redrive", JobQuery(ids=("w-dead",)))
    before = await dump(store)
    with pytest.raises(ValueError, match="redrive"):
        await act(console, found)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)
    both = await console.preview("redrive", JobQuery(ids=("dep", "w-dead")))
    assert (await act(console, both)).outcome == {"redriven": 2}
    assert [(await store.get(job_id)).status for job_id in ("dep", "w-dead")] == ["pending", "waiting"]  # type: ignore[union-attr]
