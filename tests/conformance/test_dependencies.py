"""Dependencies on each driver (docs/dependencies.md): a job waits (``waiting``, in no claim) for the jobs it names
in ``after``; the transaction that ends its last dependency releases it; each edge's policy for a dependency that
ends dead (``dead``, ``run``, ``wait``); a graph enqueued whole or refused with nothing written; cancel and redrive
of both ends; retention never removes what a waiting dependant needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.core.dependencies import Dependency, DependencyState
from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(60)


async def run(store: QueueStore, job_id: str, result: str, now: int, queue: str = "default") -> None:
    """Claim ``job_id`` (the only ready job of its queue) and finish it with ``result``."""
    [ticket] = await claim(store, "w1", now, queue=queue)
    assert ticket.id == job_id, (ticket.id, job_id)
    assert await store.finish([outcome(ticket, result)], now) == ["done" if result == "ok" else "dead"]


async def status_of(store: QueueStore, job_id: str) -> str:
    job = await store.get(job_id)
    assert job is not None, job_id
    return job.status


async def test_a_graph_is_stored_whole_and_no_claim_sees_a_waiting_job(store: QueueStore) -> None:
    await store.enqueue([new("a"), new("b"), new("c", after=["a", "b"], priority=7), new("d", after=["c"])])
    state = await dump(store)
    assert {job_id: (job.status, job.waits) for job_id, job in state.jobs.items()} == {
        "a": ("pending", 0), "b": ("pending", 0), "c": ("waiting", 2), "d": ("waiting", 1),
    }  # fmt: skip
    assert [ticket.id for ticket in await claim(store, "w1", T0 + 1, n=10)] == ["a", "b"]
    waits = await store.waits_for(["c", "d", "a"])
    assert waits["c"].dependencies == (
        DependencyState("a", "leased", "dead", "open"),
        DependencyState("b", "leased", "dead", "open"),
    )
    assert waits["d"].unmet == (DependencyState("c", "waiting", "dead", "open"),) and waits["a"].dependencies == ()
    listed = await Queue(store, clock=lambda: T0).list_jobs(status="waiting")
    assert [job.id for job in listed] == ["c", "d"]


async def test_the_commit_that_finishes_the_last_dependency_releases_and_may_claim_the_dependant(
    store: QueueStore,
) -> None:
    await store.enqueue([new("a"), new("b"), new("c", after=["a", "b"], priority=9)])
    [ta, tb] = await claim(store, "w1", T0, n=2)
    assert await store.finish([outcome(ta, "ok")], T0 + 5) == ["done"]
    assert await claim(store, "w1", T0 + 6) == []  # c still waits for b
    statuses, tickets, *_ = await store.settle_and_claim(
        [outcome(tb, "ok")], T0 + 10, "w1", 1_000, [("default", 5)], None
    )
    assert statuses == ["done"] and [t.id for t in tickets] == ["c"]  # released and claimed in one commit
    assert tickets[0].priority == 9  # a released job keeps its priority


async def test_a_dependency_that_ends_dead_ends_its_dependants_by_default_in_cascade(store: QueueStore) -> None:
    await store.enqueue([new("a"), new("b", after=["a"]), new("c", after=["b"]), new("d", after=["a"], on_dead="run")])
    before = await dump(store)
    await run(store, "a", "permanent", T0 + 10)
    after = await dump(store)
    assert {job_id: (job.status, job.reason) for job_id, job in after.jobs.items()} == {
        "a": ("dead", "permanent"), "b": ("dead", "dependency"), "c": ("dead", "dependency"), "d": ("pending", None),
    }  # fmt: skip
    assert after.jobs["c"].available_at == T0 + 10 and before.jobs["c"].available_at == T0


async def test_policy_wait_keeps_waiting_and_a_redrive_of_the_dependency_re_arms_it(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 20)
    await store.enqueue([new("a"), new("b", after=[Dependency("a", on_dead="wait")])])
    await run(store, "a", "permanent", T0 + 10)
    assert (await dump(store)).jobs["b"].status == "waiting"
    await queue.redrive("a", "fixed")
    assert (await dump(store, T0 + 20)).jobs["b"].status == "waiting"  # a runs again first
    await run(store, "a", "ok", T0 + 30)
    assert await status_of(store, "b") == "pending"


async def test_a_dependant_redriven_waits_for_what_is_still_unmet(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 50)
    await store.enqueue([new("a"), new("b"), new("c", after=["a", "b"])])
    await run(store, "a", "ok", T0 + 1)
    await run(store, "b", "permanent", T0 + 2)
    assert await status_of(store, "c") == "dead"
    before = await dump(store, T0 + 50)
    with pytest.raises(ValueError, match="redrive it first"):
        await queue.redrive("c", "too soon")  # b is dead under policy dead: it would end again at once
    assert await dump(store, T0 + 50) == before  # no audit row, nothing changed
    await queue.redrive("b", "fixed")
    await queue.redrive("c", "again")
    assert await status_of(store, "c") == "waiting"
    await run(store, "b", "ok", T0 + 60)
    job = await store.get("c")
    assert job is not None and (job.status, job.waits) == ("pending", 0)


async def test_a_dependency_done_or_dead_before_the_enqueue_is_evaluated_at_once(store: QueueStore) -> None:
    await store.enqueue([new("done"), new("dead")])
    await run(store, "done", "ok", T0 + 1)
    await run(store, "dead", "permanent", T0 + 2)
    await store.enqueue(
        [
            new("met", T0 + 3, after=["done"]),
            new("failed", T0 + 3, after=["dead"]),
            new("anyway", T0 + 3, after=[Dependency("dead", on_dead="run")]),
            new("held", T0 + 3, after=["done", Dependency("dead", on_dead="wait")]),
            new("after-failed", T0 + 3, after=["failed"]),
        ]
    )
    jobs = (await dump(store, T0 + 3)).jobs
    assert {job_id: (jobs[job_id].status, jobs[job_id].reason, jobs[job_id].waits) for job_id in jobs} == {
        "done": ("done", None, 0), "dead": ("dead", "permanent", 0), "met": ("pending", None, 0),
        "failed": ("dead", "dependency", 1), "anyway": ("pending", None, 0), "held": ("waiting", None, 1),
        "after-failed": ("dead", "dependency", 1),
    }  # fmt: skip


async def test_unknown_ids_and_cycles_are_refused_with_nothing_written(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    before = await dump(store)
    with pytest.raises(ValueError, match="do not exist: 'ghost'"):
        await store.enqueue([new("b"), new("c", after=["a", "ghost"])])
    with pytest.raises(ValueError, match="cycle"):
        await store.enqueue([new("x", after=["y"]), new("y", after=["z"]), new("z", after=["x"])])
    queue = Queue(store, clock=lambda: T0)
    with pytest.raises(ValueError, match="cycle"):  # the facade refuses it before any statement
        await queue.enqueue_many([JobSpec("x", {}, after=["y"]), JobSpec("y", {}, after=["x"])])
    with pytest.raises(ValueError, match="wait for itself"):
        await queue.enqueue("self", {}, after=["self"])
    with pytest.raises(TypeError, match="list or tuple"):
        await queue.enqueue("s", {}, after="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        await queue.enqueue("s", {}, after=["a", "a"])
    with pytest.raises(ValueError, match="on_dependency_dead"):
        await queue.enqueue("s", {}, after=["a"], on_dependency_dead="maybe")  # type: ignore[arg-type]
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_in_an_app_transaction_a_dependant_may_name_jobs_enqueued_before_it(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    async with queue.transaction() as tx:
        await tx.enqueue("fetch-1", {"url": 1})
        await tx.enqueue("fetch-2", {"url": 2})
        await tx.enqueue("merge", {}, after=["fetch-1", "fetch-2"], on_dependency_dead="run")
        with pytest.raises(ValueError, match="do not exist"):
            await tx.enqueue("lost", {}, after=["nowhere"])
    jobs = (await dump(store)).jobs
    assert (jobs["merge"].status, jobs["merge"].waits, "lost" in jobs) == ("waiting", 2, False)


async def test_a_dependency_on_a_job_not_added_waits_for_the_job_holding_its_key(store: QueueStore) -> None:
    await enqueue(store, new("holder", unique_key="k"))
    added = await store.enqueue([new("twin", unique_key="k"), new("after-twin", after=["twin"])])
    assert added == ["holder", True]
    assert (await store.waits_for(["after-twin"]))["after-twin"].dependencies[0].id == "holder"
    await run(store, "holder", "ok", T0 + 1)
    assert await status_of(store, "after-twin") == "pending"


async def test_a_waiting_job_holds_its_unique_key(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    await store.enqueue([new("w", unique_key="daily", after=["a"])])
    assert await store.enqueue([new("w2", unique_key="daily")]) == ["w"]


async def test_cancelling_a_waiting_job_or_a_dependency(store: QueueStore) -> None:
    await store.enqueue([new("a"), new("b", after=["a"]), new("c", after=["b"]), new("d", after=["a"], on_dead="run")])
    cancelled = await store.cancel("b", T0 + 5, "not needed")
    assert (cancelled.state, cancelled.status) == ("cancelled", "dead")
    jobs = (await dump(store, T0 + 5)).jobs
    assert (jobs["c"].status, jobs["c"].reason) == ("dead", "dependency")  # b ended dead: c by its policy
    await store.cancel("a", T0 + 6, "stop")  # a dependency cancelled: its dependants by their policies
    jobs = (await dump(store, T0 + 6)).jobs
    assert (jobs["a"].reason, jobs["d"].status) == ("cancelled", "pending")


async def test_a_waiting_job_past_its_deadline_is_swept_and_its_dependants_follow(store: QueueStore) -> None:
    await store.enqueue([new("a", delay_ms=10_000), new("b", ttl_ms=2_000, after=["a"]), new("c", after=["b"])])
    assert await claim(store, "w1", T0 + 2_000) == []  # the sweep runs first in any claim
    jobs = (await dump(store, T0 + 2_000)).jobs
    assert [(jobs[j].status, jobs[j].reason) for j in "abc"] == [("pending", None), ("dead", "deadline"),
                                                              ("dead", "dependency")]  # fmt: skip


async def test_a_released_job_becomes_ready_at_its_release_or_the_end_of_its_own_delay(store: QueueStore) -> None:
    await store.enqueue([new("a"), new("b", after=["a"]), new("c", after=["a"], delay_ms=60_000)])
    before = await dump(store)
    await run(store, "a", "ok", T0 + 100)
    after = await dump(store, T0 + 100)
    done = replace(before.jobs["a"], status="done", attempts=1, token=1, available_at=T0 + 100)
    expect(
        before,
        after,
        {
            "a": done,
            "b": replace(before.jobs["b"], status="pending", waits=0, available_at=T0 + 100),
            "c": replace(before.jobs["c"], status="pending", waits=0),  # still delayed to T0 + 60 s
        },
    )


async def test_retention_and_prune_keep_a_dependency_while_a_dependant_lives(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0 + 10_000)
    await store.enqueue([new("a"), new("b"), new("c", after=["a", "b"]), new("plain", queue="other")])
    await run(store, "a", "ok", T0 + 1)
    await run(store, "plain", "ok", T0 + 2, queue="other")
    await queue.set_retention("default", done=1)
    await queue.set_retention("other", done=1)
    assert (await queue.prunable(1)).ids == ["plain"]  # a: c still waits (and may read a's result)
    report = await queue.apply_retention()
    assert report.total == 1 and await store.get("a") is not None and await store.get("plain") is None
    await run(store, "b", "ok", T0 + 3)
    await run(store, "c", "ok", T0 + 4)
    assert sorted((await queue.prunable(1)).ids) == ["a", "b", "c"]  # c ended: nothing needs them now
    await queue.prune(1)
    assert (await dump(store, T0 + 10_000)).jobs == {}
