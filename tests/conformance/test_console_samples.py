"""The console's samples through the port on every driver: each queue's figures read as ``core.samples`` defines
them, what ended and failed between two samples, a sample skipped when another is too recent, old samples and
workers forgotten past the keep, renewals seen from one look to the next; and through the facade
(``OperatorConsole.sample``)."""

from __future__ import annotations

import pytest

from asyncq.core.samples import QueueFigures, WorkerLook, WorkerSeen, lease_map, look_at_workers
from asyncq.store.port.queue import QueueStore

from .support import BOOM, T0, claim, enqueue, new, outcome

pytestmark = pytest.mark.timeout(30)


async def test_a_samples_figures_are_each_queues_depth_ready_leased_and_oldest_ready(store: QueueStore) -> None:
    await enqueue(store, new("a", queue="mail"), new("b", T0 + 5, queue="mail"), new("c", queue="mail", delay_ms=9000))
    await enqueue(store, new("w", queue="web"), new("v", queue="web"))
    await claim(store, "w1", T0 + 10, queue="web", lease_ms=5_000)
    await store.set_paused("idle", True, T0, "nothing there", "ops")
    figures = await store.console().read_figures(T0 + 100)
    assert figures.at_ms == T0 + 100 and figures.errors_seq == 0
    assert figures.queues == [
        QueueFigures("idle", 0, 0, 0, None, 0, 0, 0),
        QueueFigures("mail", 3, 2, 0, T0, 0, 0, 0),
        QueueFigures("web", 1, 1, 1, T0, 0, 0, 0),
    ]
    [lease] = figures.leases
    assert (lease.owner, lease.job_id, lease.token, lease.lease_until) == ("w1", "w", 1, T0 + 5_010)
    assert figures.queues[1].oldest_ready_age_ms(T0 + 100) == 100


async def test_what_ended_and_failed_between_two_samples_is_counted_per_queue(store: QueueStore) -> None:
    console = store.console()
    await enqueue(store, *(new(f"m{n}", queue="mail", max_attempts=2) for n in range(4)))
    first = await console.read_figures(T0 + 1)
    assert await console.write_sample(first, [], 1_000, 60_000)
    m0, m1, m2, _m3 = await claim(store, "w1", T0 + 2, queue="mail", n=4)
    finishes = [outcome(m0, "ok"), outcome(m1, "permanent", error=BOOM), outcome(m2, "retry", error=BOOM)]
    assert await store.finish(finishes, T0 + 3) == ["done", "dead", "pending"]
    second = await console.read_figures(T0 + 1_001)
    [mail] = second.queues
    assert (mail.done, mail.dead, mail.failed, mail.pending, mail.leased) == (1, 1, 2, 1, 1)
    assert second.errors_seq > first.errors_seq
    assert not await console.write_sample(second, [], 4_000, 60_000)  # one was written 1 s ago: too recent
    assert await console.write_sample(second, [], 1_000, 60_000)
    samples = await console.samples(T0)
    assert [(s.at_ms, s.queues) for s in samples] == [(T0 + 1, first.queues), (T0 + 1_001, second.queues)]
    third = await console.read_figures(T0 + 2_001)
    assert (third.queues[0].done, third.queues[0].dead, third.queues[0].failed) == (0, 0, 0)  # counted once


async def test_what_ended_is_counted_over_every_task_of_a_queue_and_none(store: QueueStore) -> None:
    console = store.console()
    bodies = [{"task": "send", "args": {}}, {"task": "report", "args": {}}, {"plain": True}]
    await enqueue(store, *(new(f"t{n}", queue="mail", body=bodies[n % 3], max_attempts=1) for n in range(9)))
    await enqueue(store, new("other", queue="web", body=bodies[0]))
    assert await console.write_sample(await console.read_figures(T0 + 1), [], 1_000, 60_000)
    tickets = await claim(store, "w1", T0 + 2, queue="mail", n=9)
    web = await claim(store, "w1", T0 + 2, queue="web")
    kinds = ["ok", "permanent", "ok", "ok", "ok", "permanent", "permanent", "ok", "ok"]
    await store.finish([outcome(t, kind) for t, kind in zip(tickets, kinds, strict=True)] + [outcome(web[0], "ok")],
                       T0 + 3)  # fmt: skip
    figures = await console.read_figures(T0 + 1_001)
    assert [(q.queue, q.done, q.dead) for q in figures.queues] == [("mail", 6, 3), ("web", 1, 0)]


async def test_samples_and_workers_older_than_the_keep_are_forgotten(store: QueueStore) -> None:
    console = store.console()
    await enqueue(store, new("a"), new("b"))
    for at in (T0, T0 + 1_000, T0 + 2_000):
        figures = await console.read_figures(at)
        look = [WorkerLook(f"w{at - T0}", 1, at - T0 > 0)]
        assert await console.write_sample(figures, look, 1_000, 1_500)
    assert [sample.at_ms for sample in await console.samples(0)] == [T0 + 1_000, T0 + 2_000]
    assert await console.workers_seen() == [
        WorkerSeen("w2000", T0 + 2_000, T0 + 2_000, 1, 1, T0 + 2_000),
        WorkerSeen("w1000", T0 + 1_000, T0 + 1_000, 1, 1, T0 + 1_000),
    ]


async def test_a_renewal_is_a_lease_whose_expiry_moved_on_under_the_same_token(store: QueueStore) -> None:
    console = store.console()
    await enqueue(store, new("a"), new("b"), new("c"))
    a, b = await claim(store, "w1", T0, n=2, lease_ms=1_000)
    first = await console.read_figures(T0 + 1)
    looks = look_at_workers({}, first.leases)
    assert looks == [WorkerLook("w1", 2, 0)]
    assert await console.write_sample(first, looks, 100, 60_000)
    assert await store.extend([(a.id, a.fence)], T0 + 500, 1_000) != [None]
    await claim(store, "w2", T0 + 600, n=1)
    second = await console.read_figures(T0 + 700)
    looks = look_at_workers(lease_map(first.leases), second.leases)
    assert looks == [WorkerLook("w1", 2, 1), WorkerLook("w2", 1, 0)]
    assert await console.write_sample(second, looks, 100, 60_000)
    seen = {worker.owner: worker for worker in await console.workers_seen()}
    assert seen["w1"] == WorkerSeen("w1", T0 + 1, T0 + 700, 2, 1, T0 + 700)
    assert seen["w2"] == WorkerSeen("w2", T0 + 700, T0 + 700, 1, 0, None)
    assert b.id == "b"


async def test_the_consoles_totals_are_the_stores_stats_without_the_attempts(store: QueueStore) -> None:
    from asyncq.core.samples import Totals

    await enqueue(store, new("a", queue="mail"), new("b"), new("c", delay_ms=5_000), new("d"))
    a, b = await claim(store, "w1", T0, queue="default", n=2, lease_ms=100)
    assert await store.finish([outcome(a, "permanent", error=BOOM)], T0 + 1) == ["dead"]
    for now in (T0 + 2, T0 + 500):  # the lease of b live, then expired
        totals = await store.console().totals(now)
        assert totals == Totals.of(await store.stats(now))
        assert totals.expired_leases == (now > b.lease_until)
