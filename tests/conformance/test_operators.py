"""The operators' calls through the port: redrive (refused with nothing changed unless the job is dead) and cancel
(too late, with nothing changed, for a job that has ended; refused for a missing one), each move with its audit row;
the audit rows' fields and order, ``get`` and ``list_jobs`` with every filter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.core.jobs import AuditEntry, Job
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


async def one_of_each(store: QueueStore) -> None:
    """Jobs in every state: pending (p, and r after a retry), leased (l), done (d), dead (x, permanent)."""
    await enqueue(store, new("l"), new("d"), new("x"), new("r"), new("p"))
    _, done, dead, retried = await claim(store, "w1", T0, n=4)
    finishes = [outcome(done, "ok"), outcome(dead, "permanent"), outcome(retried, "retry", 5_000)]
    assert await store.finish(finishes, T0 + 1) == ["done", "dead", "pending"]


@pytest.mark.parametrize("job_id", ["p", "r", "l", "d", "missing"])
async def test_a_redrive_of_a_job_that_is_not_dead_is_refused_and_changes_nothing(
    store: QueueStore, job_id: str
) -> None:
    await one_of_each(store)
    before = await dump(store)
    with pytest.raises(ValueError, match=job_id):
        await store.redrive(job_id, T0 + 2, T0 + 60_000, "ops")
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


@pytest.mark.parametrize("job_id", ["d", "x"])
async def test_a_cancel_of_a_job_that_has_ended_is_too_late_and_changes_nothing(store: QueueStore, job_id: str) -> None:
    await one_of_each(store)
    before = await dump(store)
    cancelled = await store.cancel(job_id, T0 + 2, "ops")
    assert (cancelled.state, cancelled.status, cancelled.audit) == ("too_late", before.jobs[job_id].status, None)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_cancel_of_a_missing_job_is_refused_and_changes_nothing(store: QueueStore) -> None:
    await one_of_each(store)
    before = await dump(store)
    with pytest.raises(ValueError, match="missing"):
        await store.cancel("missing", T0 + 2, "ops")
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_pending_retry_can_be_cancelled_and_redriven_each_audited_in_order(store: QueueStore) -> None:
    await one_of_each(store)
    before = await dump(store)
    cancelled = (await store.cancel("r", T0 + 2, "customer-request")).audit
    assert cancelled is not None
    redriven = await store.redrive("r", T0 + 3, T0 + 9_000, "changed-mind")
    again = await store.redrive("x", T0 + 4, T0 + 9_000, "fixed")
    after = await dump(store)
    assert cancelled == AuditEntry(cancelled.seq, "r", "cancel", 1, T0 + 2, "customer-request", "cancelled")
    assert redriven == AuditEntry(redriven.seq, "r", "redrive", 1, T0 + 3, "changed-mind", None)
    assert again == AuditEntry(again.seq, "x", "redrive", 1, T0 + 4, "fixed", None)
    assert cancelled.seq < redriven.seq < again.seq
    r = replace(before.jobs["r"], attempts=0, available_at=T0 + 3, deadline=T0 + 9_000, reason=None, redrives=1)
    x = replace(
        before.jobs["x"],
        status="pending",
        attempts=0,
        available_at=T0 + 4,
        deadline=T0 + 9_000,
        reason=None,
        redrives=1,
    )
    expect(before, after, {"r": r, "x": x}, [cancelled, redriven, again])
    assert await store.history("r") == [cancelled, redriven]
    assert await store.audit_log(2) == [again, redriven]  # newest first, at most the limit
    assert await store.history("p") == [] and await store.history("missing") == []


async def test_each_redrive_of_a_job_is_counted_and_its_tokens_only_go_up(store: QueueStore) -> None:
    await enqueue(store, new("a", max_attempts=1))
    entries = []
    for n in range(3):
        [ticket] = await claim(store, "w1", T0 + 10 * n)
        assert ticket.token == n + 1 and ticket.attempt == 1
        assert await store.finish([outcome(ticket, "retry")], T0 + 10 * n + 1) == ["dead"]
        entries.append(await store.redrive("a", T0 + 10 * n + 2, T0 + 60_000, f"round-{n}"))
    after = await dump(store)
    assert [(e.token, e.at_ms, e.note) for e in entries] == [(n + 1, T0 + 10 * n + 2, f"round-{n}") for n in range(3)]
    assert after.audit == entries and after.jobs["a"].redrives == 3 and after.jobs["a"].token == 3


async def test_get_returns_the_whole_stored_record_or_none(store: QueueStore) -> None:
    await enqueue(store, new("job", queue="mail", body={"b": [1, "two"]}, max_attempts=4, ttl_ms=9_000))
    [ticket] = await claim(store, "w1", T0, queue="mail")
    job = await store.get("job")
    assert job == Job(
        job.seq if job else 0,
        "job",
        "mail",
        {"b": [1, "two"]},
        "leased",
        1,
        4,
        1,
        T0,
        T0 + 9_000,
        "w1",
        T0 + 1_000,
        None,
    )
    assert ticket.seq == job.seq  # type: ignore[union-attr]
    assert await store.get("missing") is None


async def test_list_jobs_filters_pages_and_orders(store: QueueStore) -> None:
    await one_of_each(store)
    await enqueue(store, new("m1", queue="mail"), new("m2", queue="mail"))
    every = list((await dump(store)).jobs.values())
    seq = {job.id: job.seq for job in every}

    async def ids(**which: object) -> list[str]:
        return [job.id for job in await store.list_jobs(JobFilter(**which))]  # type: ignore[arg-type]

    assert await ids() == ["l", "d", "x", "r", "p", "m1", "m2"]
    assert await ids(status="pending") == ["r", "p", "m1", "m2"]
    assert await ids(status="pending", queue="mail") == ["m1", "m2"]
    assert await ids(reason="retry") == ["r"] and await ids(status="dead", reason="permanent") == ["x"]
    assert await ids(queue="none") == [] and await ids(status="done", reason="retry") == []
    assert await ids(after=seq["x"], limit=2) == ["r", "p"]  # a page: oldest first from just past ``after``
    assert await ids(after=seq["m2"]) == []
    assert await ids(newest=True, limit=3) == ["m2", "m1", "p"]
    assert await ids(newest=True, after=seq["p"], limit=2) == ["m2", "m1"]  # ``after`` is ignored newest first
    assert await store.list_jobs(JobFilter(body=False, limit=2)) == [replace(job, body=None) for job in every[:2]]
    assert await store.list_jobs(JobFilter(limit=1000)) == every


async def test_list_jobs_of_leased_and_dead_jobs_filters_pages_and_orders(store: QueueStore) -> None:
    """The statuses a dashboard lists on every refresh (read from their indexes by the SQLite store): filters, pages
    and both orders agree with the full listing."""
    await enqueue(store, *(new(f"j{n}", queue="mail" if n % 2 else "default") for n in range(10)))
    for queue in ("default", "mail"):
        tickets = await claim(store, "w1", T0, queue=queue, n=3)
        assert await store.finish([outcome(tickets[0], "permanent")], T0) == ["dead"]
        await store.cancel(f"j{6 if queue == 'default' else 7}", T0, "ops")
    every = list((await dump(store)).jobs.values())

    async def ids(**which: object) -> list[str]:
        return [job.id for job in await store.list_jobs(JobFilter(**which))]  # type: ignore[arg-type]

    for status in ("leased", "dead"):
        of = [job for job in every if job.status == status]
        assert await ids(status=status) == [job.id for job in of] and len(of) >= 4
        assert await ids(status=status, newest=True) == [job.id for job in reversed(of)]
        assert await ids(status=status, newest=True, limit=1) == [of[-1].id]
        assert await ids(status=status, after=of[0].seq, limit=2) == [job.id for job in of[1:3]]
        assert await ids(status=status, queue="mail") == [job.id for job in of if job.queue == "mail"]
    assert await ids(status="dead", reason="cancelled") == ["j6", "j7"]
    assert await ids(status="dead", reason="cancelled", newest=True) == ["j7", "j6"]
    assert await ids(status="leased", reason="cancelled") == []
