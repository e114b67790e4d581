"""Every move of ``asyncq.core.lifecycle.TRANSITIONS``, made through the port, with the whole stored state checked
before and after: the moved row in every column, every other row unchanged, the audit rows it adds.

Each scenario is registered under the transition it makes; a test fails if a transition has no scenario.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest
from drivers import Driver

from asyncq.core.jobs import AuditEntry, Ticket
from asyncq.core.lifecycle import TRANSITIONS, Transition
from asyncq.store.port.queue import QueueStore

from .support import T0, claim, dump, enqueue, expect, new, outcome, ticket_of

pytestmark = pytest.mark.timeout(30)

Scenario = Callable[[QueueStore, Driver], Awaitable[None]]
SCENARIOS: dict[tuple[str, str, str | None, str], Scenario] = {}


def makes(source: str, target: str, reason: str | None, actor: str) -> Callable[[Scenario], Scenario]:
    def register(scenario: Scenario) -> Scenario:
        SCENARIOS[(source, target, reason, actor)] = scenario
        return scenario

    return register


def key(move: Transition) -> tuple[str, str, str | None, str]:
    return (str(move.source), str(move.target), None if move.reason is None else str(move.reason), move.actor)


def test_every_transition_has_a_scenario_and_no_scenario_is_unlisted() -> None:
    assert set(SCENARIOS) == {key(move) for move in TRANSITIONS}


@pytest.mark.parametrize("move", TRANSITIONS, ids=lambda m: f"{m.actor}:{m.source}->{m.target}:{m.reason}")
async def test_transition(store: QueueStore, driver: Driver, move: Transition) -> None:
    await SCENARIOS[key(move)](store, driver)


# -- claim -----------------------------------------------------------------------------------------------------


@makes("pending", "leased", None, "claim")
async def claim_a_pending_job(store: QueueStore, driver: Driver) -> None:
    job = (await enqueue(store, new("a", max_attempts=2)))["a"]
    before = await dump(store)
    tickets = await claim(store, "w1", T0 + 5, lease_ms=1_000)
    after = await dump(store)
    leased = replace(job, status="leased", attempts=1, token=1, owner="w1", lease_until=T0 + 1_005)
    expect(before, after, {"a": leased})
    assert tickets == [ticket_of(leased)]


@makes("leased", "leased", None, "claim")
async def take_over_an_expired_lease(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store)
    assert await claim(store, "w2", T0 + 999) == []  # the lease is live until lease_until
    assert await dump(store) == before
    tickets = await claim(store, "w2", T0 + 1_000, lease_ms=500)
    after = await dump(store)
    taken = replace(before.jobs["a"], attempts=2, token=2, owner="w2", lease_until=T0 + 1_500)
    expect(before, after, {"a": taken})
    assert tickets == [ticket_of(taken)]


@makes("leased", "leased", None, "extend")
async def extend_a_held_lease(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store)
    fences = await store.extend([("a", ticket.fence)], T0 + 600, 1_000)
    after = await dump(store)
    assert fences == [(ticket.fence._replace(lease_until=T0 + 1_600), False)]  # same owner, token and attempt
    expect(before, after, {"a": replace(before.jobs["a"], lease_until=T0 + 1_600)})


# -- finish ----------------------------------------------------------------------------------------------------


async def finish_and_check(
    store: QueueStore, row_kwargs: dict[str, int], result: str, delay: int, **moved: object
) -> None:
    """Claim ``a`` at T0 for 1 s and finish it at T0 + 100: only ``a`` changes, to ``moved`` and no lease."""
    await enqueue(store, new("a", **row_kwargs), new("bystander", queue="other"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store, T0 + 100)
    statuses = await store.finish([outcome(ticket, result, delay)], T0 + 100)
    after = await dump(store, T0 + 100)
    job = replace(before.jobs["a"], owner=None, lease_until=None, **moved)  # type: ignore[arg-type]
    assert statuses == [job.status]
    expect(before, after, {"a": job})


@makes("leased", "done", None, "finish")
async def finish_ok(store: QueueStore, driver: Driver) -> None:
    await finish_and_check(store, {}, "ok", 5_000, status="done", reason=None, available_at=T0 + 100)


@makes("leased", "pending", "retry", "finish")
async def finish_retry_within_the_budget(store: QueueStore, driver: Driver) -> None:
    await finish_and_check(store, {}, "retry", 500, status="pending", reason="retry", available_at=T0 + 600)


@makes("leased", "dead", "exhausted", "finish")
async def finish_retry_of_the_last_attempt(store: QueueStore, driver: Driver) -> None:
    await finish_and_check(
        store, {"max_attempts": 1}, "retry", 0, status="dead", reason="exhausted", available_at=T0 + 100
    )


@makes("leased", "dead", "deadline", "finish")
async def finish_retry_due_at_the_deadline(store: QueueStore, driver: Driver) -> None:
    # ttl 1 s: a retry due at T0 + 100 + 900 = the deadline would come too late.
    await finish_and_check(
        store, {"ttl_ms": 1_000}, "retry", 900, status="dead", reason="deadline", available_at=T0 + 100
    )


@makes("leased", "dead", "permanent", "finish")
async def finish_permanent(store: QueueStore, driver: Driver) -> None:
    await finish_and_check(store, {}, "permanent", 500, status="dead", reason="permanent", available_at=T0 + 100)


# -- sweep: the first step of every claim --------------------------------------------------------------------


async def sweep_and_check(store: QueueStore, now: int, reason: str) -> None:
    before = await dump(store, now)
    assert await claim(store, "w2", now) == []
    after = await dump(store, now)
    swept = replace(before.jobs["a"], status="dead", reason=reason, owner=None, lease_until=None)
    expect(before, after, {"a": swept})  # nothing else: available_at, attempts and token are kept


@makes("pending", "dead", "deadline", "sweep")
async def sweep_a_pending_job_past_its_deadline(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", ttl_ms=1_000, delay_ms=200))
    assert await claim(store, "w1", T0 + 199) == []  # not yet available, not yet dead
    await sweep_and_check(store, T0 + 1_000, "deadline")


@makes("pending", "dead", "exhausted", "sweep")
async def sweep_a_pending_job_with_no_attempt_left(store: QueueStore, driver: Driver) -> None:
    # No port call leaves a pending row with its attempts used up (the sweep parks it defensively): forced here.
    await enqueue(store, new("a", max_attempts=2))
    driver.force(store, "a", {"attempts": 2})
    await sweep_and_check(store, T0, "exhausted")


@makes("leased", "dead", "deadline", "sweep")
async def sweep_an_expired_lease_past_its_deadline(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", ttl_ms=1_000))
    [ticket] = await claim(store, "w1", T0, lease_ms=5_000)
    assert ticket.lease_until == T0 + 1_000  # capped at the deadline
    before = await dump(store, T0 + 999)
    assert await claim(store, "w2", T0 + 999) == []  # a live lease is never swept
    assert await dump(store, T0 + 999) == before
    await sweep_and_check(store, T0 + 1_000, "deadline")


@makes("leased", "dead", "exhausted", "sweep")
async def sweep_an_expired_lease_with_no_attempt_left(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", max_attempts=1))
    await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store, T0 + 999)
    assert await claim(store, "w2", T0 + 999) == []  # used up, but its lease is live: not swept
    assert await dump(store, T0 + 999) == before
    await sweep_and_check(store, T0 + 1_000, "exhausted")


# -- operators and the pool's release -----------------------------------------------------------------------


@makes("dead", "pending", None, "redrive")
async def redrive_a_dead_job(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, "permanent")], T0 + 10) == ["dead"]
    before = await dump(store)
    entry = await store.redrive("a", T0 + 50, T0 + 90_000, "fixed-upstream")
    after = await dump(store)
    assert entry == AuditEntry(entry.seq, "a", "redrive", 1, T0 + 50, "fixed-upstream", None)
    rearmed = replace(
        before.jobs["a"],
        status="pending",
        attempts=0,
        available_at=T0 + 50,
        deadline=T0 + 90_000,
        reason=None,
        redrives=1,
    )
    expect(before, after, {"a": rearmed}, [entry])  # the token is kept: the next claim issues token 2
    [again] = await claim(store, "w1", T0 + 50)
    assert (again.token, again.attempt) == (2, 1)


@makes("pending", "dead", "cancelled", "cancel")
async def cancel_a_pending_job(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", delay_ms=5_000))
    before = await dump(store)
    cancelled = await store.cancel("a", T0 + 20, "customer-request")
    after = await dump(store)
    entry = cancelled.audit
    assert entry == AuditEntry(entry.seq if entry else 0, "a", "cancel", 0, T0 + 20, "customer-request", "cancelled")
    assert (cancelled.state, cancelled.status) == ("cancelled", "dead")
    expect(
        before,
        after,
        {"a": replace(before.jobs["a"], status="dead", reason="cancelled", available_at=T0 + 20)},
        [entry],
    )


@makes("leased", "pending", None, "release")
async def release_a_job_never_started(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store)
    assert await store.release([("a", ticket.fence), ("a", ticket.fence)], T0 + 20) == [True, False]  # then pending
    after = await dump(store)
    released = replace(
        before.jobs["a"], status="pending", attempts=0, available_at=T0 + 20, owner=None, lease_until=None
    )
    expect(before, after, {"a": released})  # the attempt is returned, the token kept
    [again] = await claim(store, "w2", T0 + 20)
    assert (again.token, again.attempt) == (2, 1)


# -- cancelling a leased job -------------------------------------------------------------------------------------


async def leased_with_a_cancel_request(store: QueueStore, lease_ms: int = 1_000) -> Ticket:
    """Job ``a`` claimed by ``w1`` at ``T0``, then a cancel requested at ``T0 + 10``."""
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=lease_ms)
    requested = await store.cancel("a", T0 + 10, "customer left")
    assert (requested.state, requested.status) == ("requested", "leased")
    return ticket


@makes("leased", "leased", None, "cancel")
async def request_the_cancel_of_a_held_job(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store)
    requested = await store.cancel("a", T0 + 10, "customer left")
    after = await dump(store)
    entry = requested.audit
    wanted = ("a", "cancel_request", 1, T0 + 10, "customer left", "cancelled")
    assert entry == AuditEntry(entry.seq if entry else 0, *wanted)
    expect(before, after, {"a": replace(before.jobs["a"], cancel_requested_at=T0 + 10)}, [entry])
    again = await store.cancel("a", T0 + 20, "again")  # the first request stands; nothing more is written
    assert (again.state, again.audit) == ("requested", None)
    expect(after, await dump(store))
    # the holder's renewal says so, fenced like itself
    [renewal] = await store.extend([("a", ticket.fence)], T0 + 500, 1_000)
    assert renewal == (ticket.fence._replace(lease_until=T0 + 1_500), True)


@makes("leased", "dead", "cancelled", "cancel")
async def cancel_a_job_whose_lease_expired(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"))
    [ticket] = await claim(store, "w1", T0, lease_ms=1_000)
    before = await dump(store, T0 + 1_000)
    cancelled = await store.cancel("a", T0 + 1_000, "worker gone")
    after = await dump(store, T0 + 1_000)
    entry = cancelled.audit
    assert entry == AuditEntry(entry.seq if entry else 0, "a", "cancel", 1, T0 + 1_000, "worker gone", "cancelled")
    gone = replace(before.jobs["a"], status="dead", reason="cancelled", available_at=T0 + 1_000)
    expect(before, after, {"a": replace(gone, owner=None, lease_until=None)}, [entry])
    assert await store.finish([outcome(ticket, "ok")], T0 + 1_001) == [None]  # its old holder is stale


@makes("leased", "dead", "cancelled", "finish")
async def the_holder_finishes_a_cancelled_job(store: QueueStore, driver: Driver) -> None:
    ticket = await leased_with_a_cancel_request(store)
    before = await dump(store)
    assert await store.finish([outcome(ticket, "cancel")], T0 + 50) == ["dead"]
    after = await dump(store)
    ended = replace(before.jobs["a"], status="dead", reason="cancelled", available_at=T0 + 50)
    expect(before, after, {"a": replace(ended, owner=None, lease_until=None)})
    assert await store.finish([outcome(ticket, "ok", held=False)], T0 + 51) == [None]  # never overwritten


@makes("pending", "dead", "cancelled", "sweep")
async def sweep_a_job_retried_with_a_cancel_request(store: QueueStore, driver: Driver) -> None:
    ticket = await leased_with_a_cancel_request(store)
    assert await store.finish([outcome(ticket, "retry")], T0 + 50) == ["pending"]  # its handler failed first
    before = await dump(store, T0 + 60)
    assert await claim(store, "w2", T0 + 60) == []  # the sweep ends it: it is not run again
    after = await dump(store, T0 + 60)
    expect(before, after, {"a": replace(before.jobs["a"], status="dead", reason="cancelled", available_at=T0 + 60)})


@makes("leased", "dead", "cancelled", "sweep")
async def sweep_an_expired_lease_with_a_cancel_request(store: QueueStore, driver: Driver) -> None:
    ticket = await leased_with_a_cancel_request(store)  # its holder stopped (SIGSTOP) and its lease ran out
    before = await dump(store, T0 + 1_000)
    assert await claim(store, "w2", T0 + 1_000) == []  # not taken over: ended
    after = await dump(store, T0 + 1_000)
    ended = replace(before.jobs["a"], status="dead", reason="cancelled", available_at=T0 + 1_000)
    expect(before, after, {"a": replace(ended, owner=None, lease_until=None)})
    assert await store.finish([outcome(ticket, "ok")], T0 + 1_001) == [None]  # the stale holder changes nothing


# -- dependencies (core.dependencies) --------------------------------------------------------------------------


@makes("waiting", "pending", None, "dependency")
async def release_a_dependant_when_its_last_dependency_is_done(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"), new("b"), new("c", after=["a", "b"]))
    [ta, tb] = await claim(store, "w1", T0, n=2)
    assert await store.finish([outcome(ta, "ok")], T0 + 10) == ["done"]
    waiting = await dump(store)
    assert (waiting.jobs["c"].status, waiting.jobs["c"].waits) == ("waiting", 1)
    assert await store.finish([outcome(tb, "ok")], T0 + 20) == ["done"]  # the same transaction releases c
    after = await dump(store)
    done_b = replace(waiting.jobs["b"], status="done", available_at=T0 + 20, owner=None, lease_until=None)
    released = replace(waiting.jobs["c"], status="pending", waits=0, available_at=T0 + 20)
    expect(waiting, after, {"b": done_b, "c": released})


@makes("waiting", "dead", "dependency", "dependency")
async def end_a_dependant_whose_dependency_ended_dead(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"), new("b", after=["a"]))
    [ta] = await claim(store, "w1", T0)
    before = await dump(store)
    assert await store.finish([outcome(ta, "permanent")], T0 + 10) == ["dead"]
    after = await dump(store)
    dead_a = replace(before.jobs["a"], status="dead", reason="permanent", available_at=T0 + 10, owner=None,
                     lease_until=None)  # fmt: skip
    ended = replace(before.jobs["b"], status="dead", reason="dependency", available_at=T0 + 10)
    expect(before, after, {"a": dead_a, "b": ended})  # b keeps its count: a redrive evaluates its edge again


@makes("waiting", "dead", "deadline", "sweep")
async def sweep_a_waiting_job_past_its_deadline(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", delay_ms=50_000), new("b", ttl_ms=1_000, after=["a"]))
    before = await dump(store)
    assert await claim(store, "w1", T0 + 1_000, queue="other") == []  # any claim sweeps every queue
    after = await dump(store)
    expect(before, after, {"b": replace(before.jobs["b"], status="dead", reason="deadline")})


@makes("waiting", "dead", "cancelled", "cancel")
async def cancel_a_waiting_job(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"), new("b", after=["a"]))
    before = await dump(store)
    cancelled = await store.cancel("b", T0 + 20, "not needed")
    after = await dump(store)
    assert (cancelled.state, cancelled.status) == ("cancelled", "dead")
    entry = cancelled.audit
    assert entry == AuditEntry(entry.seq if entry else 0, "b", "cancel", 0, T0 + 20, "not needed", "cancelled")
    ended = replace(before.jobs["b"], status="dead", reason="cancelled", available_at=T0 + 20)
    expect(before, after, {"b": ended}, [entry])


@makes("dead", "waiting", None, "redrive")
async def redrive_a_dependant_whose_dependency_is_not_met(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a"), new("b", after=["a"]))
    await store.cancel("b", T0 + 20, "paused by mistake")
    before = await dump(store)
    entry = await store.redrive("b", T0 + 50, T0 + 90_000, "wanted after all")
    after = await dump(store)
    assert entry == AuditEntry(entry.seq, "b", "redrive", 0, T0 + 50, "wanted after all", None)
    rearmed = replace(before.jobs["b"], status="waiting", available_at=T0 + 50, deadline=T0 + 90_000, reason=None,
                      redrives=1)  # fmt: skip
    expect(before, after, {"b": rearmed}, [entry])  # it waits for a again, then runs once a is done
