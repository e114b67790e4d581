"""Claim through the port: oldest ``seq`` first among ready rows of the asked queue, several at once each with its
own fence, the sweep first (in every queue), the group commit's finishes before its claims in one transaction,
and what the rules say when the caller's clock is behind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.core.jobs import Job, Ticket
from asyncq.core.lifecycle import Fence
from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, enqueue, expect, new, outcome, ticket_of

pytestmark = pytest.mark.timeout(30)


def leased(job: Job, owner: str, lease_until: int) -> Job:
    """``job`` after one more claim by ``owner``."""
    return replace(
        job,
        status="leased",
        attempts=job.attempts + 1,
        token=job.token + 1,
        owner=owner,
        lease_until=lease_until,
        reason=None,
    )


async def test_a_claim_takes_the_oldest_ready_jobs_of_its_queue_each_with_its_own_fence(store: QueueStore) -> None:
    await enqueue(
        store, *(new(f"job-{n}") for n in range(5)), new("elsewhere", queue="other"), new("later", delay_ms=1_000)
    )
    before = await dump(store)
    tickets = await claim(store, "w1", T0, n=3, lease_ms=1_000)
    after = await dump(store)
    moved = {f"job-{n}": leased(before.jobs[f"job-{n}"], "w1", T0 + 1_000) for n in range(3)}
    expect(before, after, moved)
    assert tickets == [ticket_of(after.jobs[f"job-{n}"]) for n in range(3)]
    assert await store.finish([outcome(tickets[1], "ok")], T0 + 1) == ["done"]  # each fenced on its own
    assert (await store.get("job-0")).status == "leased"  # type: ignore[union-attr]
    assert [t.id for t in await claim(store, "w2", T0 + 1, n=10)] == ["job-3", "job-4"]


async def test_a_claimed_ticket_is_the_value_its_constructor_builds_from_the_stored_row(store: QueueStore) -> None:
    await enqueue(store, new("job-0", body={"b": [1, 2], "a": "x"}))
    [ticket] = await claim(store, "w1", T0)
    job = await store.get("job-0")
    assert job is not None
    built = Ticket("job-0", "default", '{"a":"x","b":[1,2]}', Fence("w1", 1, 1, T0 + 1_000), job.deadline, 3, job.seq)
    assert ticket == built and repr(ticket) == repr(built) and hash(ticket) == hash(built)
    assert ticket.body == {"a": "x", "b": [1, 2]} and ticket.held == built.held
    assert (ticket.token, ticket.attempt, ticket.lease_until) == (1, 1, T0 + 1_000)
    renewed = replace(ticket, fence=ticket.fence._replace(lease_until=ticket.lease_until + 1))
    assert (renewed.id, renewed.seq, renewed.lease_until) == ("job-0", job.seq, T0 + 1_001)
    with pytest.raises(AttributeError):
        ticket.id = "other"  # type: ignore[misc]


async def test_nothing_ready_claims_nothing_and_changes_nothing(store: QueueStore) -> None:
    await enqueue(store, new("later", delay_ms=1_000), new("elsewhere", queue="other"))
    before = await dump(store)
    assert await claim(store, "w1", T0 + 999, n=10) == []  # available_at is not yet reached
    assert await claim(store, "w1", T0, queue="empty", n=10) == []
    expect(before, await dump(store))
    [ticket] = await claim(store, "w1", T0 + 1_000)  # available_at == now is ready
    assert ticket.id == "later"


async def test_a_group_commit_finishes_first_then_claims_by_queue_within_its_total(store: QueueStore) -> None:
    await enqueue(
        store,
        new("a1", queue="a"),
        new("a2", queue="a"),
        new("b1", queue="b"),
        new("b2", queue="b"),
        new("c1", queue="c"),
    )
    [held] = await claim(store, "w1", T0, queue="a", lease_ms=1_000)
    before = await dump(store, T0 + 10)
    # The retried job is pending again by the time the claims run, so the same commit takes it back (token 2).
    statuses, tickets, _started, _holds = await store.settle_and_claim(
        [outcome(held, "retry", 0)], T0 + 10, "w2", 500, [("a", 2), ("c", 0), ("b", 5)], 3
    )
    after = await dump(store, T0 + 10)
    assert statuses == ["pending"]
    a1 = leased(replace(before.jobs["a1"], reason="retry", available_at=T0 + 10), "w2", T0 + 510)
    moved = {"a1": a1, "a2": leased(before.jobs["a2"], "w2", T0 + 510), "b1": leased(before.jobs["b1"], "w2", T0 + 510)}
    expect(before, after, moved)
    # Want by want, at most 3; within a queue by the time each became ready: a1's retry made it ready after a2.
    assert tickets == [ticket_of(after.jobs[job_id]) for job_id in ("a2", "a1", "b1")]
    assert after.jobs["a1"].token == 2 and after.jobs["a1"].attempts == 2
    assert await store.settle_and_claim([], T0 + 10, "w2", 500, [("b", 5)], 0) == ([], [], [], ())  # a total of 0


async def test_the_sweep_runs_first_and_in_every_queue(store: QueueStore) -> None:
    await enqueue(store, new("short", queue="other", ttl_ms=1_000), new("ready", ttl_ms=60_000))
    before = await dump(store, T0 + 1_000)
    [ticket] = await claim(store, "w1", T0 + 1_000)
    after = await dump(store, T0 + 1_000)
    swept = replace(before.jobs["short"], status="dead", reason="deadline")
    expect(before, after, {"short": swept, "ready": leased(before.jobs["ready"], "w1", T0 + 2_000)})
    assert ticket.id == "ready"


async def test_a_lease_is_capped_at_the_deadline(store: QueueStore) -> None:
    await enqueue(store, new("a", ttl_ms=1_000))
    [ticket] = await claim(store, "w1", T0 + 400, lease_ms=60_000)
    assert ticket.lease_until == T0 + 1_000 == ticket.deadline
    assert (await store.extend([("a", ticket.fence)], T0 + 500, 60_000)) == [(ticket.fence, False)]  # still capped


async def test_a_live_lease_is_never_taken_over_nor_swept(store: QueueStore) -> None:
    await enqueue(store, new("a", max_attempts=1))
    await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store, T0 + 999)
    for now in (T0, T0 + 999):
        assert await claim(store, "w2", now) == []
    expect(before, await dump(store, T0 + 999))


# -- time moving backwards ---------------------------------------------------------------------------------


async def test_a_claim_at_an_earlier_now_than_the_enqueue_finds_nothing(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    before = await dump(store)
    assert await claim(store, "w1", T0 - 1) == []
    expect(before, await dump(store))


async def test_a_worker_whose_clock_is_behind_can_neither_take_over_nor_finish_a_newer_lease(
    store: QueueStore,
) -> None:
    await enqueue(store, new("a"), new("b"))
    [first] = await claim(store, "w1", T0, lease_ms=1_000)
    [taken] = await claim(store, "w2", T0 + 1_000, lease_ms=1_000)  # w1's lease expired: taken over, token 2
    assert taken.id == "a" and taken.token == 2
    before = await dump(store, T0 + 500)
    assert await claim(store, "w1", T0 + 500, lease_ms=1_000) == [ticket_of(leased(before.jobs["b"], "w1", T0 + 1_500))]
    after = await dump(store, T0 + 500)
    # 2 s behind: "a" looks expired to nobody (lease_until T0 + 2000), and w1's old ticket is stale.
    assert await store.finish([outcome(first, "ok")], T0 + 500) == [None]
    assert await store.extend([("a", first.fence)], T0 + 500, 1_000) == [None]
    assert await store.release([("a", first.fence)], T0 + 500) == [False]
    expect(after, await dump(store, T0 + 500))


async def test_rows_enqueued_at_an_earlier_now_are_claimed_by_the_time_they_became_ready(store: QueueStore) -> None:
    await store.enqueue([new("first", T0 + 1_000)])
    await store.enqueue([new("second", T0)])  # the clock went back: available earlier, but a later seq
    assert [t.id for t in await claim(store, "w1", T0 + 500, n=2)] == ["second"]  # "first" is not yet available
    await store.enqueue([new("third", T0)])
    # Ready first is claimed first, whatever the seq (docs/flow-control.md): third (T0) before first (T0 + 1000).
    assert [t.id for t in await claim(store, "w1", T0 + 1_000, n=2)] == ["third", "first"]


async def test_an_extend_or_release_dated_before_the_claim_follows_the_rules(store: QueueStore) -> None:
    # Both land while the fence holds and now < lease_until. The renewal is min(now + lease, deadline), so with a
    # clock that went back it ends earlier than the lease it replaces; the release stamps that earlier now.
    await enqueue(store, new("a"), new("b"))
    a, b = await claim(store, "w1", T0 + 1_000, n=2, lease_ms=1_000)
    before = await dump(store, T0 + 500)
    assert await store.extend([("a", a.fence)], T0 + 500, 600) == [(a.fence._replace(lease_until=T0 + 1_100), False)]
    assert await store.release([("b", b.fence)], T0 + 500) == [True]
    released = replace(
        before.jobs["b"], status="pending", attempts=0, available_at=T0 + 500, owner=None, lease_until=None
    )
    expect(before, await dump(store, T0 + 500), {"a": replace(before.jobs["a"], lease_until=T0 + 1_100), "b": released})
