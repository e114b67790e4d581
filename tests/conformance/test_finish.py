"""Finish through the port: each outcome as ``decide_finish`` rules it (precedence and boundaries), batches where
each ticket is fenced on its own, the failed attempt's error kept with the job, and a clock that went back.

Both ways of deciding are run: on the claim's snapshot (``held``, the pool's group commit) and on the row read in
the transaction (``held=None``); a mixed batch too. The rules, and so the stored state, must be the same."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.core.jobs import AttemptError, Job
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import BOOM, DOOM, T0, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)

HOW = ["held", "row", "mixed"]


def decided(how: str, position: int) -> bool:
    """Whether the finish at ``position`` of a batch carries the claim's snapshot."""
    return {"held": True, "row": False, "mixed": position % 2 == 0}[how]


def ended(job: Job, status: str, reason: str | None, available_at: int) -> Job:
    return replace(job, status=status, reason=reason, available_at=available_at, owner=None, lease_until=None)


@pytest.mark.parametrize("how", HOW)
async def test_a_batch_with_one_stale_member_lands_the_rest_and_changes_nothing_of_the_stale_one(
    store: QueueStore, how: str
) -> None:
    await enqueue(store, new("stale"), new("fresh-1"), new("fresh-2"), new("fresh-3"))
    [stale] = await claim(store, "w1", T0, lease_ms=100)
    [taken] = await claim(store, "w2", T0 + 100, lease_ms=10_000)  # the expired lease is taken over
    assert (taken.id, taken.token) == ("stale", 2)
    fresh = await claim(store, "w1", T0 + 100, n=3, lease_ms=10_000)
    before = await dump(store, T0 + 200)
    batch = [(fresh[0], "ok", 0), (stale, "ok", 0), (fresh[1], "retry", 500), (fresh[2], "permanent", 0)]
    finishes = [outcome(t, result, delay, held=decided(how, n)) for n, (t, result, delay) in enumerate(batch)]
    assert await store.finish(finishes, T0 + 200) == ["done", None, "pending", "dead"]
    after = await dump(store, T0 + 200)
    jobs = before.jobs
    expect(
        before,
        after,
        {
            "fresh-1": ended(jobs["fresh-1"], "done", None, T0 + 200),
            "fresh-2": ended(jobs["fresh-2"], "pending", "retry", T0 + 700),
            "fresh-3": ended(jobs["fresh-3"], "dead", "permanent", T0 + 200),
        },
    )
    assert await store.finish([outcome(taken, "ok")], T0 + 200) == ["done"]
    assert await store.finish([], T0 + 200) == []


@pytest.mark.parametrize("how", HOW)
async def test_one_ticket_twice_in_a_batch_lands_once(store: QueueStore, how: str) -> None:
    await enqueue(store, new("job"))
    [ticket] = await claim(store, "w1", T0, lease_ms=10_000)
    before = await dump(store, T0 + 1)
    twice = [outcome(ticket, "retry", 500, held=decided(how, 0)), outcome(ticket, "ok", held=decided(how, 1))]
    assert await store.finish(twice, T0 + 1) == ["pending", None]
    expect(before, await dump(store, T0 + 1), {"job": ended(before.jobs["job"], "pending", "retry", T0 + 501)})


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize(
    ("options", "result", "delay", "status", "reason"),
    [
        ({"max_attempts": 1}, "permanent", 0, "dead", "permanent"),  # permanent before exhausted
        ({"max_attempts": 1, "ttl_ms": 1_000}, "retry", 5_000, "dead", "exhausted"),  # exhausted before deadline
        ({"ttl_ms": 1_000}, "retry", 899, "pending", "retry"),  # due 1 ms before the deadline
        ({"ttl_ms": 1_000}, "retry", 900, "dead", "deadline"),  # due at the deadline
        ({}, "ok", 5_000, "done", None),  # the delay of ok and permanent is ignored
    ],
)
async def test_the_outcome_follows_the_rules_precedence_and_boundaries(
    store: QueueStore, held: bool, options: dict[str, int], result: str, delay: int, status: str, reason: str | None
) -> None:
    await enqueue(store, new("a", **options))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store, T0 + 100)
    assert await store.finish([outcome(ticket, result, delay, held=held)], T0 + 100) == [status]
    available = T0 + 100 + (delay if status == "pending" else 0)
    expect(before, await dump(store, T0 + 100), {"a": ended(before.jobs["a"], status, reason, available)})


async def test_finishes_past_one_statements_worth_of_rows_each_land_on_their_own_row(store: QueueStore) -> None:
    await store.enqueue([new(f"job-{n:03d}") for n in range(150)])
    tickets = await claim(store, "w1", T0, n=150, lease_ms=10_000)
    before = await dump(store, T0 + 1, deep=False)
    results = ["ok", "retry", "permanent"]
    statuses = await store.finish([outcome(t, results[n % 3], 1_000) for n, t in enumerate(tickets)], T0 + 1)
    assert statuses == [("done", "pending", "dead")[n % 3] for n in range(150)]
    reasons, delays = (None, "retry", "permanent"), (0, 1_000, 0)
    changes = {
        t.id: ended(before.jobs[t.id], statuses[n] or "", reasons[n % 3], T0 + 1 + delays[n % 3])
        for n, t in enumerate(tickets)
    }
    expect(before, await dump(store, T0 + 1, deep=False), changes)


async def test_a_renewed_ticket_finishes_and_the_one_before_the_renewal_is_stale(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    [renewal] = await store.extend([("a", ticket.fence)], T0 + 500, 1_000)
    assert renewal is not None
    fence = renewal.fence
    before = await dump(store, T0 + 600)
    assert await store.finish([outcome(ticket, "ok"), outcome(ticket, "ok", held=False)], T0 + 600) == [None, None]
    expect(before, await dump(store, T0 + 600))
    renewed = replace(ticket, fence=fence)
    assert await store.finish([outcome(renewed, "ok")], T0 + 1_200) == ["done"]  # past the first lease
    expect(before, await dump(store, T0 + 1_200), {"a": ended(before.jobs["a"], "done", None, T0 + 1_200)})


# -- the error of a failed attempt ---------------------------------------------------------------------------


@pytest.mark.parametrize("held", [True, False])
async def test_each_failed_attempts_error_is_kept_with_the_job_oldest_first(store: QueueStore, held: bool) -> None:
    await enqueue(store, new("a"), new("b", delay_ms=1_000))  # b is not ready when a, retried, is claimed again
    [first] = await claim(store, "w1", T0)
    assert await store.finish([outcome(first, "retry", 0, held=held, error=BOOM)], T0 + 10) == ["pending"]
    [second] = await claim(store, "w1", T0 + 20)
    before = await dump(store, T0 + 30)
    assert await store.finish([outcome(second, "permanent", held=held, error=DOOM)], T0 + 30) == ["dead"]
    after = await dump(store, T0 + 30)
    errors = (AttemptError(1, T0 + 10, *BOOM), AttemptError(2, T0 + 30, *DOOM))
    expect(before, after, {"a": replace(ended(before.jobs["a"], "dead", "permanent", T0 + 30), errors=errors)})
    assert after.jobs["a"].last_error == errors[-1]
    [listed_a, listed_b] = await store.list_jobs(JobFilter(errors=True))
    assert listed_a == replace(after.jobs["a"], errors=errors[-1:]) and listed_b == after.jobs["b"]
    [bodiless] = await store.list_jobs(JobFilter(status="dead", body=False, errors=True))
    assert bodiless == replace(after.jobs["a"], body=None, errors=errors[-1:])


@pytest.mark.parametrize("held", [True, False])
async def test_a_job_claimed_ahead_keeps_its_error_under_the_attempt_its_finish_counts(
    store: QueueStore, held: bool
) -> None:
    # Claimed ahead (start_now=0: its attempt not counted yet) and failed before a commit counted it: the finish
    # counts the attempt, and the error is kept under that number, the row's attempts after the finish.
    await enqueue(store, new("a"))
    settled = await store.settle_and_claim([], T0, "w1", 1_000, [("default", 1)], 1, start_now=0)
    [ahead] = settled.tickets
    assert not ahead.counted and ahead.fence.attempt == 0
    failed = outcome(ahead, "retry", 0, held=held, error=BOOM)._replace(counted=False)
    assert await store.finish([failed], T0 + 10) == ["pending"]
    [counted] = await claim(store, "w1", T0 + 20)  # claimed for now: its attempt is counted at the claim
    assert counted.fence.attempt == 2
    assert await store.finish([outcome(counted, "permanent", held=held, error=DOOM)], T0 + 30) == ["dead"]
    after = await dump(store, T0 + 30)
    assert after.jobs["a"].attempts == 2
    assert after.jobs["a"].errors == (AttemptError(1, T0 + 10, *BOOM), AttemptError(2, T0 + 30, *DOOM))


@pytest.mark.parametrize("held", [True, False])
async def test_a_stale_finish_keeps_no_error(store: QueueStore, held: bool) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=100)
    [taken] = await claim(store, "w2", T0 + 100)
    before = await dump(store, T0 + 150)
    assert await store.finish([outcome(ticket, "retry", 0, held=held, error=BOOM)], T0 + 150) == [None]
    expect(before, await dump(store, T0 + 150))
    assert taken.token == 2


# -- time moving backwards -----------------------------------------------------------------------------------


@pytest.mark.parametrize("held", [True, False])
async def test_a_finish_dated_before_its_claim_lands_as_the_rules_say(store: QueueStore, held: bool) -> None:
    # The fence holds and now is before both lease_until and the deadline: the finish lands, stamped with that now.
    await enqueue(store, new("ok"), new("retry"))
    ok, retry = await claim(store, "w1", T0 + 1_000, n=2, lease_ms=1_000)
    before = await dump(store, T0 + 400)
    finishes = [outcome(ok, "ok", held=held), outcome(retry, "retry", 100, held=held)]
    assert await store.finish(finishes, T0 + 400) == ["done", "pending"]
    after = await dump(store, T0 + 400)
    jobs = before.jobs
    expect(
        before,
        after,
        {"ok": ended(jobs["ok"], "done", None, T0 + 400), "retry": ended(jobs["retry"], "pending", "retry", T0 + 500)},
    )
    assert [t.id for t in await claim(store, "w1", T0 + 500)] == ["retry"]
