"""The race rules of cancelling a job (``core.lifecycle.decide_cancel``), through the port on every driver, the whole
state checked: a finish that landed first wins (the cancel is ``too_late``); a finish by the holder after a request
stands as it says, except that a retried or released job is ended by the next claim's sweep, never run again; a
stale holder never overwrites ``cancelled``; a redrive clears the request."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


async def test_a_finish_that_landed_first_wins_and_the_cancel_is_too_late(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, "ok")], T0 + 5) == ["done"]
    before = await dump(store)
    late = await store.cancel("a", T0 + 6, "too slow")
    assert (late.id, late.state, late.status, late.audit) == ("a", "too_late", "done", None)
    expect(before, await dump(store))


async def test_the_holders_ok_after_a_request_stands(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert (await store.cancel("a", T0 + 5, "stop")).state == "requested"
    before = await dump(store)
    assert await store.finish([outcome(ticket, "ok")], T0 + 6) == ["done"]  # its work was done: done it is
    after = await dump(store)
    done = replace(before.jobs["a"], status="done", available_at=T0 + 6, owner=None, lease_until=None)
    expect(before, after, {"a": done})
    assert after.jobs["a"].cancel_requested_at == T0 + 5  # the request stays on the row, as a record
    assert (await store.cancel("a", T0 + 7, "again")).state == "too_late"


async def test_a_job_released_with_a_request_is_ended_by_the_next_claim(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert (await store.cancel("a", T0 + 5, "stop")).state == "requested"
    assert await store.release([("a", ticket.fence)], T0 + 6) == [True]  # pending again, the request kept
    assert await claim(store, "w2", T0 + 7) == []
    job = (await dump(store, T0 + 7)).jobs["a"]
    assert (job.status, job.reason, job.token) == ("dead", "cancelled", 1)


async def test_a_stale_holder_never_overwrites_cancelled(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [first] = await claim(store, "w1", T0, lease_ms=1_000)
    [second] = await claim(store, "w2", T0 + 1_000, lease_ms=1_000)  # took the expired lease over
    assert (await store.cancel("a", T0 + 1_010, "stop")).state == "requested"
    assert await store.finish([outcome(second, "cancel")], T0 + 1_020) == ["dead"]
    before = await dump(store, T0 + 1_030)
    for stale in (first, second):
        for result in ("ok", "retry", "cancel"):
            assert await store.finish([outcome(stale, result, held=False)], T0 + 1_030) == [None]
    assert await store.extend([("a", second.fence)], T0 + 1_030, 1_000) == [None]
    expect(before, await dump(store, T0 + 1_030))


async def test_a_redrive_clears_the_request_and_the_job_runs_again(store: QueueStore) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert (await store.cancel("a", T0 + 5, "stop")).state == "requested"
    assert await store.finish([outcome(ticket, "cancel")], T0 + 6) == ["dead"]
    await store.redrive("a", T0 + 7, T0 + 60_000, "changed my mind")
    job = (await dump(store, T0 + 7)).jobs["a"]
    assert (job.status, job.cancel_requested_at) == ("pending", None)
    [again] = await claim(store, "w2", T0 + 8)
    assert again.id == "a" and again.token == 2
    assert await store.finish([outcome(again, "ok")], T0 + 9) == ["done"]
    actions = [entry.action for entry in await store.history("a")]
    assert actions == ["cancel_request", "redrive"]
