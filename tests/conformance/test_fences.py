"""The fence: a finish, extend or release lands only while every column of it (owner, token, attempt,
lease_until) and the id still match and the lease has not expired. A ticket wrong in any one of them changes
nothing (``None``/``False``), in a batch too, and the true ticket still lands afterwards, so the refusal was the
fence's. A finish on the claim's snapshot also checks the snapshot (seq, budget, deadline)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from asyncq.core.failures import ErrorText
from asyncq.core.jobs import Ticket
from asyncq.core.lifecycle import Fence
from asyncq.store.port.queue import QueueStore

from .support import T0, Dump, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)

NOW = T0 + 100
FORGED: dict[str, Callable[[Fence], Fence]] = {
    "owner": lambda f: f._replace(owner="w2"),
    "token+1": lambda f: f._replace(token=f.token + 1),
    "token-1": lambda f: f._replace(token=f.token - 1),
    "attempt": lambda f: f._replace(attempt=f.attempt + 1),
    "lease_until+1": lambda f: f._replace(lease_until=f.lease_until + 1),
    "lease_until-1": lambda f: f._replace(lease_until=f.lease_until - 1),
}
CALLS = ["finish-held", "finish-row", "extend", "release"]


async def call(store: QueueStore, how: str, job_id: str, ticket: Ticket, now: int) -> object:
    """One fenced call for ``ticket`` under ``job_id``: what it returned (the new status, fence or flag)."""
    if how.startswith("finish"):
        finish = outcome(ticket, "ok", held=how == "finish-held")
        return (await store.finish([finish._replace(id=job_id)], now))[0]
    if how == "extend":
        renewal = (await store.extend([(job_id, ticket.fence)], now, 1_000))[0]
        return None if renewal is None else renewal.fence
    return (await store.release([(job_id, ticket.fence)], now))[0]


def refused(how: str) -> object:
    return False if how == "release" else None


async def held_lease(store: QueueStore) -> tuple[Ticket, Dump]:
    """Job ``a`` leased by w1 (token 2 after one expired lease), a bystander; the state at ``NOW``."""
    await enqueue(store, new("a", T0 - 2_000), new("b", T0 - 2_000))
    await claim(store, "w1", T0 - 2_000, lease_ms=1_000)
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    assert (ticket.id, ticket.token, ticket.attempt) == ("a", 2, 2)
    return ticket, await dump(store, NOW)


async def lands(store: QueueStore, how: str, ticket: Ticket, before: Dump) -> None:
    """The true ticket still lands, as each call's rule says."""
    result = await call(store, how, "a", ticket, NOW)
    job = before.jobs["a"]
    if how.startswith("finish"):
        assert result == "done"
        job = replace(job, status="done", available_at=NOW, owner=None, lease_until=None)
    elif how == "extend":
        assert result == ticket.fence._replace(lease_until=NOW + 1_000)
        job = replace(job, lease_until=NOW + 1_000)
    else:
        assert result is True
        job = replace(job, status="pending", attempts=1, available_at=NOW, owner=None, lease_until=None)
    expect(before, await dump(store, NOW), {"a": job})


@pytest.mark.parametrize("how", CALLS)
@pytest.mark.parametrize("column", FORGED)
async def test_a_ticket_wrong_in_one_fence_column_changes_nothing(store: QueueStore, how: str, column: str) -> None:
    ticket, before = await held_lease(store)
    forged = replace(ticket, fence=FORGED[column](ticket.fence))
    assert await call(store, how, "a", forged, NOW) == refused(how)
    expect(before, await dump(store, NOW))
    await lands(store, how, ticket, before)


@pytest.mark.parametrize("how", CALLS)
async def test_a_ticket_under_another_or_a_missing_id_changes_nothing(store: QueueStore, how: str) -> None:
    ticket, before = await held_lease(store)
    [other] = await claim(store, "w1", T0, lease_ms=1_000)  # "b": same owner and lease, token and attempt 1
    before = await dump(store, NOW)
    for job_id in ("b", "missing"):
        assert await call(store, how, job_id, ticket, NOW) == refused(how)
    expect(before, await dump(store, NOW))
    assert other.id == "b"
    await lands(store, how, ticket, before)


@pytest.mark.parametrize("how", CALLS)
async def test_an_expired_lease_changes_nothing_even_before_it_is_taken_over(store: QueueStore, how: str) -> None:
    ticket, _ = await held_lease(store)
    at_expiry = await dump(store, ticket.lease_until)
    assert await call(store, how, "a", ticket, ticket.lease_until) == refused(how)
    expect(at_expiry, await dump(store, ticket.lease_until))
    assert await call(store, how, "a", ticket, ticket.lease_until - 1) not in (None, False)  # 1 ms before: held


@pytest.mark.parametrize("how", CALLS)
async def test_the_ticket_of_an_earlier_life_changes_nothing(store: QueueStore, how: str) -> None:
    await enqueue(store, new("a", max_attempts=1))
    [old] = await claim(store, "w1", T0)
    assert await store.finish([outcome(old, "retry")], T0 + 1) == ["dead"]  # exhausted
    await store.redrive("a", T0 + 2, T0 + 60_000, "ops")
    [current] = await claim(store, "w1", T0 + 3)
    assert (current.attempt, current.token) == (old.attempt, old.token + 1)
    before = await dump(store, T0 + 4)
    assert await call(store, how, "a", old, T0 + 4) == refused(how)
    expect(before, await dump(store, T0 + 4))


@pytest.mark.parametrize(
    "forge",
    [
        lambda last, other: replace(last, max_attempts=5),
        lambda last, other: replace(last, deadline=last.deadline + 60_000),
        lambda last, other: replace(last, seq=other.seq),
    ],
    ids=["max_attempts", "deadline", "seq"],
)
async def test_a_snapshot_that_differs_from_the_row_is_stale(store: QueueStore, forge: Callable) -> None:
    # Decided on a forged budget the retry would be "pending"; on a forged seq it would finish another job.
    await enqueue(store, new("last", max_attempts=1, ttl_ms=1_000), new("other"))
    last, other = await claim(store, "w1", T0, n=2, lease_ms=10_000)
    before = await dump(store, T0 + 1)
    forged = forge(last, other)
    assert await store.finish([outcome(forged, "retry", 500)], T0 + 1) == [None]
    assert await store.finish([outcome(forged, "retry", 500), outcome(other, "ok")], T0 + 1) == [None, "done"]
    after = await dump(store, T0 + 1)
    expect(
        before,
        after,
        {"other": replace(before.jobs["other"], status="done", available_at=T0 + 1, owner=None, lease_until=None)},
    )
    assert await store.finish([outcome(last, "retry", 500)], T0 + 1) == ["dead"]  # the true snapshot: used up
    assert (await store.get("last")).reason == "exhausted"  # type: ignore[union-attr]


async def test_twins_claimed_together_are_told_apart_by_their_id(store: QueueStore) -> None:
    # Two jobs claimed in one call match in every lifecycle column: only the id (and seq) tells them apart.
    await enqueue(store, new("twin-a"), new("twin-b"))
    a, b = await claim(store, "w1", T0, n=2, lease_ms=10_000)
    assert (a.fence, a.max_attempts, a.deadline) == (b.fence, b.max_attempts, b.deadline)
    before = await dump(store, T0 + 1)
    swapped = [outcome(replace(b, seq=a.seq), "ok"), outcome(replace(a, seq=b.seq), "ok")]
    assert await store.finish(swapped, T0 + 1) == [None, None]
    assert await store.finish([outcome(a, "ok")._replace(id="twin-b")], T0 + 1) == [None]
    expect(before, await dump(store, T0 + 1))
    assert await store.finish([outcome(a, "ok"), outcome(b, "ok")], T0 + 1) == ["done", "done"]


async def test_extend_and_release_batches_apply_each_lease_on_its_own(store: QueueStore) -> None:
    await enqueue(store, new("a"), new("b"), new("c"))
    a, b, c = await claim(store, "w1", T0, n=3, lease_ms=1_000)
    assert await store.finish([outcome(b, "ok")], T0 + 1) == ["done"]
    before = await dump(store, T0 + 500)
    leases = [(t.id, t.fence) for t in (a, b, c)]
    assert await store.extend(leases, T0 + 500, 2_000) == [
        (a.fence._replace(lease_until=T0 + 2_500), False),
        None,
        (c.fence._replace(lease_until=T0 + 2_500), False),
    ]
    middle = await dump(store, T0 + 500)
    jobs = before.jobs
    expect(
        before,
        middle,
        {"a": replace(jobs["a"], lease_until=T0 + 2_500), "c": replace(jobs["c"], lease_until=T0 + 2_500)},
    )
    renewed = [("a", a.fence._replace(lease_until=T0 + 2_500)), ("b", b.fence), leases[2]]
    assert await store.release(renewed, T0 + 600) == [True, False, False]  # c's fence is the one before renewal
    released = replace(
        middle.jobs["a"], status="pending", attempts=0, available_at=T0 + 600, owner=None, lease_until=None
    )
    expect(middle, await dump(store, T0 + 600), {"a": released})


async def test_empty_batches_return_nothing_and_change_nothing(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    await claim(store, "w1", T0)
    before = await dump(store)
    assert await store.enqueue([]) == []
    assert await store.finish([], T0 + 1) == []
    assert await store.extend([], T0 + 1, 1_000) == []
    assert await store.release([], T0 + 1) == []
    assert await store.settle_and_claim([], T0 + 1, "w1", 1_000, [], None) == ([], [], [], ())
    expect(before, await dump(store))


@pytest.mark.parametrize("result", ["ok", "retry", "permanent"])
async def test_a_finish_sent_again_as_a_resend_counts_as_landed_and_changes_nothing_more(
    store: QueueStore, result: str
) -> None:
    """A pool whose group commit lost its reply after ``COMMIT`` (``StoreBusy.may_have_landed``) sends the same
    finishes again as a ``resend``: one already in its row under its token is landed (its status, not stale), and
    nothing more is written (no second error row). Sent again without ``resend``, the same finish is stale, as any
    repeated finish is."""
    await enqueue(store, new("j", max_attempts=3))
    (ticket,) = await claim(store, "w1", NOW)
    error = ErrorText("ValueError", "boom", "") if result != "ok" else None
    finish = outcome(ticket, result, 5_000 if result == "retry" else 0, error=error)
    first = await store.settle_and_claim([finish], NOW + 1, "w1", 1_000, [], 0)
    assert first.statuses[0] is not None
    after = await dump(store, NOW + 1)
    plain = await store.settle_and_claim([finish], NOW + 2, "w1", 1_000, [], 0)
    assert plain.statuses == [None]  # a repeated finish, as ever
    again = await store.settle_and_claim([finish], NOW + 2, "w1", 1_000, [], 0, resend=True)
    assert again.statuses == first.statuses  # the first commit landed: so does the resend
    assert await dump(store, NOW + 1) == after  # and it wrote nothing more


async def test_a_resend_whose_first_commit_did_not_land_lands_now(store: QueueStore) -> None:
    await enqueue(store, new("j"))
    (ticket,) = await claim(store, "w1", NOW)
    before = await dump(store, NOW)
    settled = await store.settle_and_claim([outcome(ticket, "ok")], NOW + 1, "w1", 1_000, [], 0, resend=True)
    assert settled.statuses == ["done"]
    assert (await dump(store, NOW + 1)) != before


async def test_a_resend_does_not_take_another_ending_of_the_job_for_its_own(store: QueueStore) -> None:
    """The same token's row ended another way (cancelled by an operator while it ran): the resend of an ``ok`` is
    stale, not landed."""
    await enqueue(store, new("j"))
    (ticket,) = await claim(store, "w1", NOW)
    settled = await store.settle_and_claim([outcome(ticket, "cancel")], NOW + 1, "w1", 1_000, [], 0)
    assert settled.statuses == ["dead"]
    again = await store.settle_and_claim([outcome(ticket, "ok")], NOW + 2, "w1", 1_000, [], 0, resend=True)
    assert again.statuses == [None]
