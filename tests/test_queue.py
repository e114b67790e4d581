"""The ``Queue`` facade on real SQLite files: enqueue, claim, finish, extend, redrive, cancel, stats, the
schema version and durability settings, ``transaction()``, ``enqueue_sync`` and cancellation.

Time is the injected clock ``t[0]`` (milliseconds); no test sleeps to let time pass. Every file is read
back through an independent ``sqlite3`` connection, so the checks see what is on disk, not what the
queue's connection believes.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import T0

from asyncq.core.jobs import MAX_BODY_BYTES, JobSpec, Ticket
from asyncq.core.lifecycle import Fence
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.store.sqlite.sync import enqueue_sync

pytestmark = pytest.mark.timeout(20)


# --- helpers -----------------------------------------------------------------------------------------


def read(path: Path, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``statement`` read through a fresh, independent connection."""
    con = sqlite3.connect(path, timeout=5)
    try:
        return con.execute(statement, parameters).fetchall()
    finally:
        con.close()


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of asyncq's two tables, to prove a refused call changed nothing."""
    return {
        "jobs": read(path, "SELECT * FROM asyncq_jobs ORDER BY seq"),
        "audit": read(path, "SELECT * FROM asyncq_audit ORDER BY seq"),
    }


def job_row(path: Path, job_id: str) -> dict[str, Any]:
    con = sqlite3.connect(path, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        row = con.execute("SELECT * FROM asyncq_jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    assert row is not None, job_id
    return dict(row)


# --- enqueue -----------------------------------------------------------------------------------------


async def test_enqueue_same_id_same_body_is_a_no_op_even_with_keys_in_another_order(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    assert await queue.enqueue("job-1", {"a": 1, "b": [1, 2], "c": {"x": 1, "y": 2}}) is True
    before = snapshot(path)
    clock[0] += 5_000  # a no-op must not touch available_at or deadline either
    assert await queue.enqueue("job-1", {"c": {"y": 2, "x": 1}, "b": [1, 2], "a": 1}) is False
    assert snapshot(path) == before


async def test_enqueue_same_id_other_body_is_a_conflict_and_changes_nothing(queue: Queue, path: Path) -> None:
    await queue.enqueue("job-1", {"a": 1})
    before = snapshot(path)
    with pytest.raises(Conflict):
        await queue.enqueue("job-1", {"a": 2})
    with pytest.raises(Conflict):  # the same body on another queue is another job
        await queue.enqueue("job-1", {"a": 1}, queue="other")
    assert snapshot(path) == before


async def test_enqueue_stores_the_row_the_lifecycle_starts_from(queue: Queue, path: Path) -> None:
    await queue.enqueue("job-1", {"n": 1}, queue="mail", max_attempts=5, ttl_ms=60_000, delay_ms=2_000)
    row = job_row(path, "job-1")
    assert row["queue"] == "mail"
    assert row["body"] == '{"n":1}'
    assert (row["status"], row["attempts"], row["max_attempts"], row["token"]) == ("pending", 0, 5, 0)
    assert (row["available_at"], row["deadline"]) == (T0 + 2_000, T0 + 60_000)
    assert (row["owner"], row["lease_until"], row["reason"]) == (None, None, None)


async def test_enqueue_many_is_atomic_when_one_job_conflicts(queue: Queue, path: Path) -> None:
    await queue.enqueue("existing", {"v": 1})
    before = snapshot(path)
    batch = [JobSpec("new-1", {"v": 1}), JobSpec("existing", {"v": 2}), JobSpec("new-2", {"v": 1})]
    with pytest.raises(Conflict):
        await queue.enqueue_many(batch)
    assert snapshot(path) == before


async def test_enqueue_many_is_atomic_when_one_job_is_invalid(queue: Queue, path: Path) -> None:
    before = snapshot(path)
    with pytest.raises(ValueError):
        await queue.enqueue_many([JobSpec("new-1", {"v": 1}), JobSpec("bad id", {"v": 1})])
    with pytest.raises(ValueError):
        await queue.enqueue_many([JobSpec("new-1", {"v": 1}), JobSpec("new-2", {"v": float("nan")})])
    assert snapshot(path) == before


async def test_enqueue_many_reports_each_job_and_accepts_repeats_in_one_batch(queue: Queue, path: Path) -> None:
    await queue.enqueue("old", [1])
    added = await queue.enqueue_many([JobSpec("old", [1]), JobSpec("new", [2]), JobSpec("new", [2])])
    assert added == [False, True, False]
    assert [r[0] for r in read(path, "SELECT id FROM asyncq_jobs ORDER BY seq")] == ["old", "new"]


async def test_enqueue_many_over_several_insert_statements_reports_each_job_in_order(queue: Queue, path: Path) -> None:
    # 600 jobs take three INSERT_ROWS statements (256 + 256 + 88, padded to 128); known ids sit in each.
    await queue.enqueue_many([JobSpec(f"job-{n:03d}", {"n": n}) for n in (5, 300, 599)])
    added = await queue.enqueue_many([JobSpec(f"job-{n:03d}", {"n": n}) for n in range(600)])
    assert added == [n not in (5, 300, 599) for n in range(600)]
    rows = read(path, "SELECT id, body, status, attempts, token FROM asyncq_jobs ORDER BY seq")
    expected_order = [5, 300, 599] + [n for n in range(600) if n not in (5, 300, 599)]  # seq follows the batch
    assert rows == [(f"job-{n:03d}", f'{{"n":{n}}}', "pending", 0, 0) for n in expected_order]


async def test_enqueue_many_conflict_in_a_later_insert_statement_changes_nothing(queue: Queue, path: Path) -> None:
    await queue.enqueue("job-500", {"n": 500})
    before = snapshot(path)
    batch = [JobSpec(f"job-{n:03d}", {"n": n if n != 500 else -1}) for n in range(600)]
    with pytest.raises(Conflict, match="job-500"):
        await queue.enqueue_many(batch)
    assert snapshot(path) == before  # the 599 rows already inserted by then were rolled back
    assert await queue.enqueue("after", {}) is True  # and no transaction was left open


async def test_enqueue_many_repeating_an_id_with_another_body_is_a_conflict(queue: Queue, path: Path) -> None:
    before = snapshot(path)
    with pytest.raises(Conflict, match="twin"):
        await queue.enqueue_many([JobSpec("twin", {"v": 1}), JobSpec("other", {}), JobSpec("twin", {"v": 2})])
    assert snapshot(path) == before


async def test_body_is_capped_at_64_kib_of_canonical_json(queue: Queue, path: Path) -> None:
    largest = "x" * (MAX_BODY_BYTES - 2)  # the two quotes make it exactly 64 KiB
    assert await queue.enqueue("fits", largest) is True
    before = snapshot(path)
    with pytest.raises(ValueError):
        await queue.enqueue("too-big", largest + "x")
    with pytest.raises(ValueError):  # counted in UTF-8 bytes, not characters
        await queue.enqueue("too-big", "é" * (MAX_BODY_BYTES // 2))
    assert snapshot(path) == before


BAD_ENQUEUES: list[tuple[Any, Any, dict[str, Any]]] = [
    ("", {}, {}),
    ("a b", {}, {}),
    ("a\n", {}, {}),
    ("é", {}, {}),
    ("x" * 65, {}, {}),
    (7, {}, {}),  # an id must be a str
    ("ok", {}, {"queue": ""}),
    ("ok", {}, {"queue": "with space"}),
    ("ok", {}, {"queue": None}),
    ("ok", {}, {"max_attempts": True}),
    ("ok", {}, {"max_attempts": 0}),
    ("ok", {}, {"max_attempts": 2.0}),
    ("ok", {}, {"ttl_ms": True}),
    ("ok", {}, {"ttl_ms": 0}),
    ("ok", {}, {"delay_ms": False}),
    ("ok", {}, {"delay_ms": -1}),
    ("ok", {}, {"delay_ms": 10, "ttl_ms": 5}),  # would be due after its deadline
    ("ok", float("nan"), {}),
    ("ok", {"x": math.inf}, {}),
    ("ok", {1, 2}, {}),
    ("ok", object(), {}),
]


@pytest.mark.parametrize(("job_id", "body", "options"), BAD_ENQUEUES)
async def test_bad_enqueue_input_is_a_value_error_before_any_change(
    queue: Queue, path: Path, job_id: Any, body: Any, options: dict[str, Any]
) -> None:
    await queue.enqueue("present", {"v": 1})
    before = snapshot(path)
    with pytest.raises(ValueError):
        await queue.enqueue(job_id, body, **options)
    async with queue.transaction() as tx:
        with pytest.raises(ValueError):
            await tx.enqueue(job_id, body, **options)
    assert snapshot(path) == before


async def test_bad_worker_and_operator_input_is_a_value_error_before_any_change(queue: Queue, path: Path) -> None:
    await queue.enqueue("j", {})
    [ticket] = await queue.claim("w1", lease_ms=1_000)
    await queue.enqueue("k", {})
    before = snapshot(path)
    bad_calls = [
        queue.claim("", lease_ms=1_000),
        queue.claim("w1", queue="a b"),
        queue.claim("w1", limit=True),
        queue.claim("w1", limit=0),
        queue.claim("w1", lease_ms=0),
        queue.finish(ticket, "done"),
        queue.finish(ticket, "ok", delay=-1),
        queue.finish(ticket, "retry", delay=True),
        queue.finish_many([(ticket, "ok", 0), (ticket, "maybe", 0)]),
        queue.extend(ticket, lease_ms=True),
        queue.redrive("j", "has a space"),
        queue.redrive("j", "note", ttl_ms=0),
        queue.cancel("k", ""),
        queue.cancel("bad id", "note"),
        queue.get("bad id"),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            await call
    assert snapshot(path) == before


# --- claim, finish, extend -----------------------------------------------------------------------------


async def test_claim_takes_several_jobs_in_one_call_each_with_its_own_fence(queue: Queue, path: Path) -> None:
    for n in range(5):
        await queue.enqueue(f"job-{n}", {"n": n})
    await queue.enqueue("elsewhere", {}, queue="other")
    tickets = await queue.claim("w1", limit=3, lease_ms=1_000)
    assert [t.id for t in tickets] == ["job-0", "job-1", "job-2"]  # oldest first, this queue only
    for ticket in tickets:
        row = job_row(path, ticket.id)
        assert ticket.body == {"n": int(ticket.id[-1])}
        assert (row["status"], row["owner"], row["token"], row["attempts"]) == ("leased", "w1", 1, 1)
        assert ticket.fence.owner == "w1"
        assert (ticket.token, ticket.attempt, ticket.lease_until) == (1, 1, T0 + 1_000)
    # Each ticket is fenced on its own: finishing one leaves the others' leases alone.
    assert await queue.finish(tickets[1], "ok") == "done"
    assert job_row(path, "job-0")["status"] == "leased"
    assert await queue.finish(tickets[0], "ok") == "done"
    assert [t.id for t in await queue.claim("w2", limit=10)] == ["job-3", "job-4"]


async def test_a_claimed_ticket_is_the_ticket_its_constructor_builds(queue: Queue, path: Path) -> None:
    # Ticket.from_row fills the frozen dataclass's fields in one step instead of through its __init__: the
    # result must be the same value, with the same decoded body and the same behaviour under replace().
    await queue.enqueue("job-0", {"b": [1, 2], "a": "x"})
    [ticket] = await queue.claim("w1", lease_ms=1_000)
    row = job_row(path, "job-0")  # the stored row, read on its own connection, not the ticket's own values
    fence = Fence(row["owner"], row["token"], row["attempts"], row["lease_until"])
    built = Ticket("job-0", "default", row["body"], fence, row["deadline"], row["max_attempts"], row["seq"])
    seq = row["seq"]
    assert ticket == built and repr(ticket) == repr(built) and hash(ticket) == hash(built)
    assert ticket.body == {"a": "x", "b": [1, 2]} and ticket.held == built.held
    renewed = replace(ticket, fence=ticket.fence._replace(lease_until=ticket.lease_until + 1))
    assert (renewed.id, renewed.seq, renewed.lease_until) == ("job-0", seq, ticket.lease_until + 1)
    with pytest.raises(AttributeError):
        ticket.id = "other"  # type: ignore[misc]


async def test_an_expired_lease_is_reclaimed_with_the_next_token(queue: Queue, path: Path, clock: list[int]) -> None:
    await queue.enqueue("job", {})
    [first] = await queue.claim("w1", lease_ms=1_000)
    assert await queue.claim("w2", lease_ms=1_000) == []
    clock[0] += 1_000
    [second] = await queue.claim("w2", lease_ms=1_000)
    assert (second.token, second.attempt, second.fence.owner) == (2, 2, "w2")
    assert await queue.finish(first, "ok") is None
    assert await queue.finish(second, "ok") == "done"


async def test_finish_many_checks_each_ticket_on_its_own(queue: Queue, path: Path, clock: list[int]) -> None:
    for job_id in ("stale", "fresh-1", "fresh-2"):
        await queue.enqueue(job_id, {"id": job_id})
    [stale] = await queue.claim("w1", lease_ms=100)
    clock[0] += 200
    [taken] = await queue.claim("w2", lease_ms=10_000)  # the expired lease is taken over
    assert (taken.id, taken.token) == ("stale", 2)
    fresh = await queue.claim("w1", limit=2, lease_ms=10_000)
    assert [t.id for t in fresh] == ["fresh-1", "fresh-2"]
    taken_row = job_row(path, "stale")

    statuses = await queue.finish_many([(fresh[0], "ok", 0), (stale, "ok", 0), (fresh[1], "retry", 500)])

    assert statuses == ["done", None, "pending"]
    assert job_row(path, "stale") == taken_row  # the stale ticket changed nothing
    assert job_row(path, "fresh-1")["status"] == "done"
    row = job_row(path, "fresh-2")
    assert (row["status"], row["reason"], row["available_at"]) == ("pending", "retry", clock[0] + 500)
    assert await queue.finish(taken, "ok") == "done"
    assert await queue.finish_many([]) == []


async def test_finish_many_with_one_ticket_twice_lands_it_once(queue: Queue, path: Path, clock: list[int]) -> None:
    # Both outcomes are decided on the claim's snapshot; once the first has landed, the row no longer
    # matches it, and the statement's compare-and-set refuses the second as stale.
    await queue.enqueue("job", {})
    [ticket] = await queue.claim("w1", lease_ms=10_000)
    assert await queue.finish_many([(ticket, "retry", 500), (ticket, "ok", 0)]) == ["pending", None]
    row = job_row(path, "job")
    assert (row["status"], row["reason"], row["available_at"]) == ("pending", "retry", clock[0] + 500)


async def test_a_ticket_whose_snapshot_differs_from_the_row_is_stale_and_changes_nothing(
    queue: Queue, path: Path
) -> None:
    # A finish is decided on the ticket's snapshot of the row (seq, attempts budget, deadline) without
    # reading it; the compare-and-set checks every one of them. A forged budget would turn an exhausted
    # retry into "pending", a forged deadline would allow a retry past it, a forged seq would finish another
    # job: each is refused.
    await queue.enqueue("last", {}, max_attempts=1)
    await queue.enqueue("other", {})
    last, other = await queue.claim("w1", limit=2, lease_ms=10_000)
    before = snapshot(path)
    forged = [
        replace(last, max_attempts=5),
        replace(last, deadline=last.deadline + 60_000),
        replace(last, seq=other.seq),
        replace(other, seq=last.seq),
    ]
    for ticket in forged:  # one by one: the batched statement's compare-and-set
        assert await queue.finish(ticket, "retry") is None
    # together (the same job twice in a batch is finished row by row, in order)
    assert await queue.finish_many([(ticket, "retry", 0) for ticket in forged]) == [None] * 4
    assert snapshot(path) == before
    assert await queue.finish(last, "retry") == "dead"  # the true snapshot: the budget is spent
    assert job_row(path, "last")["reason"] == "exhausted"


async def test_a_ticket_naming_another_jobs_seq_finishes_neither(queue: Queue, path: Path) -> None:
    # Two jobs claimed together can match in every lifecycle column (owner, token, attempt, lease, budget,
    # deadline): only the id tells them apart, so the compare-and-set checks it too.
    await queue.enqueue_many([JobSpec("twin-a", {}), JobSpec("twin-b", {})])
    a, b = await queue.claim("w1", limit=2, lease_ms=10_000)
    assert (a.fence[1:], a.max_attempts, a.deadline) == (b.fence[1:], b.max_attempts, b.deadline)
    before = snapshot(path)
    assert await queue.finish(replace(a, seq=b.seq), "ok") is None
    assert await queue.finish_many([(replace(b, seq=a.seq), "ok", 0), (replace(a, seq=b.seq), "ok", 0)]) == [None, None]
    assert snapshot(path) == before
    assert await queue.finish_many([(a, "ok", 0), (b, "ok", 0)]) == ["done", "done"]


async def test_finish_many_past_one_statements_worth_of_rows_lands_each_outcome(queue: Queue, path: Path) -> None:
    # 150 finishes are written 64 rows a statement; every outcome lands on its own row.
    await queue.enqueue_many([JobSpec(f"job-{n:03d}", {"n": n}) for n in range(150)])
    tickets = await queue.claim("w1", limit=150, lease_ms=10_000)
    outcomes = ["ok", "retry", "permanent"]
    results = [(ticket, outcomes[n % 3], 1_000) for n, ticket in enumerate(tickets)]
    statuses = await queue.finish_many(results)
    assert statuses == [("done", "pending", "dead")[n % 3] for n in range(150)]
    for n, ticket in enumerate(tickets):
        row = job_row(path, ticket.id)
        assert (row["status"], row["owner"], row["lease_until"]) == (statuses[n], None, None)
        assert row["reason"] == (None, "retry", "permanent")[n % 3]


async def test_finish_outcomes_follow_the_lifecycle(queue: Queue, path: Path) -> None:
    await queue.enqueue("perm", {})
    await queue.enqueue("last", {}, max_attempts=1)
    perm, last = await queue.claim("w1", limit=2)
    assert await queue.finish(perm, "permanent") == "dead"
    assert await queue.finish(last, "retry") == "dead"
    assert (job_row(path, "perm")["reason"], job_row(path, "last")["reason"]) == ("permanent", "exhausted")


async def test_extend_renews_a_held_lease_and_refuses_a_stale_fence(queue: Queue, path: Path, clock: list[int]) -> None:
    await queue.enqueue("job", {}, ttl_ms=10_000)
    [ticket] = await queue.claim("w1", lease_ms=1_000)
    clock[0] += 600
    renewed = await queue.extend(ticket, lease_ms=1_000)
    assert renewed is not None
    assert (renewed.token, renewed.attempt, renewed.lease_until) == (1, 1, clock[0] + 1_000)
    assert job_row(path, "job")["lease_until"] == clock[0] + 1_000
    before = snapshot(path)
    assert await queue.extend(ticket, lease_ms=1_000) is None  # the old fence names the old lease_until
    assert await queue.finish(ticket, "ok") is None
    assert snapshot(path) == before
    clock[0] += 900  # past the original lease, within the renewed one
    capped = await queue.extend(renewed, lease_ms=60_000)
    assert capped is not None and capped.lease_until == T0 + 10_000  # never past the deadline
    clock[0] = capped.lease_until
    assert await queue.extend(capped) is None  # expired
    assert await queue.finish(capped, "ok") is None


async def test_extend_many_renews_the_held_and_refuses_the_lost(queue: Queue, clock: list[int]) -> None:
    await queue.enqueue("a", {})
    await queue.enqueue("b", {})
    a, b = await queue.claim("w1", limit=2, lease_ms=1_000)
    assert await queue.finish(b, "ok") == "done"
    renewed = await queue.extend_many([a, b], lease_ms=2_000)
    assert renewed[1] is None
    assert renewed[0] is not None and renewed[0].lease_until == clock[0] + 2_000


# --- operators ---------------------------------------------------------------------------------------


async def kill_by_exhaustion(queue: Queue, job_id: str) -> Ticket:
    await queue.enqueue(job_id, {"k": 1}, max_attempts=1)
    [ticket] = await queue.claim("w1")
    assert await queue.finish(ticket, "retry") == "dead"
    return ticket


async def test_redrive_rearms_a_dead_job_with_an_audit_row(queue: Queue, path: Path, clock: list[int]) -> None:
    ticket = await kill_by_exhaustion(queue, "job")
    clock[0] += 1_000
    entry = await queue.redrive("job", "fixed-upstream", ttl_ms=50_000)
    assert (entry.id, entry.action, entry.token, entry.at_ms) == ("job", "redrive", ticket.token, clock[0])
    row = job_row(path, "job")
    assert (row["status"], row["attempts"], row["reason"], row["token"]) == ("pending", 0, None, 1)
    assert (row["available_at"], row["deadline"]) == (clock[0], clock[0] + 50_000)
    audit = read(path, "SELECT id, token, at_ms, note, action, reason FROM asyncq_audit")
    assert audit == [("job", ticket.token, clock[0], "fixed-upstream", "redrive", None)]
    [again] = await queue.claim("w1")
    assert (again.token, again.attempt) == (2, 1)


async def test_redrive_of_a_live_or_missing_job_is_refused(queue: Queue, path: Path) -> None:
    await queue.enqueue("pending", {})
    await queue.enqueue("leased", {})
    await queue.claim("w1", limit=1)  # "pending" is older: it is the one leased
    before = snapshot(path)
    for job_id in ("pending", "leased", "missing"):
        with pytest.raises(ValueError):
            await queue.redrive(job_id, "note")
    assert snapshot(path) == before


async def test_cancel_parks_a_pending_job_as_dead_with_an_audit_row(queue: Queue, path: Path, clock: list[int]) -> None:
    await queue.enqueue("job", {})
    entry = await queue.cancel("job", "customer-request")
    assert (entry.action, entry.note, entry.reason) == ("cancel", "customer-request", "cancelled")
    row = job_row(path, "job")
    assert (row["status"], row["reason"], row["available_at"]) == ("dead", "cancelled", clock[0])
    audit = read(path, "SELECT id, token, at_ms, note, action, reason FROM asyncq_audit")
    assert audit == [("job", 0, clock[0], "customer-request", "cancel", "cancelled")]
    assert await queue.claim("w1") == []


async def test_cancel_of_a_job_that_is_not_pending_is_refused(queue: Queue, path: Path) -> None:
    await queue.enqueue("leased", {})
    await queue.enqueue("done", {})
    _leased, done = await queue.claim("w1", limit=2)
    await queue.finish(done, "ok")
    await kill_by_exhaustion(queue, "dead")
    before = snapshot(path)
    assert [row[4] for row in before["jobs"]] == ["leased", "done", "dead"]
    for job_id in ("leased", "done", "dead", "missing"):
        with pytest.raises(ValueError):
            await queue.cancel(job_id, "note")
    assert snapshot(path) == before


async def test_get_returns_the_stored_record(queue: Queue, clock: list[int]) -> None:
    await queue.enqueue("job", {"b": [1, "two"]}, queue="mail", max_attempts=4, ttl_ms=9_000)
    [ticket] = await queue.claim("w1", queue="mail", lease_ms=1_000)
    job = await queue.get("job")
    assert job is not None
    assert (job.id, job.queue, job.body, job.status) == ("job", "mail", {"b": [1, "two"]}, "leased")
    assert (job.attempts, job.max_attempts, job.token, job.owner) == (1, 4, 1, "w1")
    assert (job.available_at, job.deadline, job.lease_until, job.reason) == (T0, T0 + 9_000, T0 + 1_000, None)
    assert ticket.deadline == job.deadline
    assert await queue.get("missing") is None


async def test_stats_counts_states_reasons_ages_and_leases(queue: Queue, clock: list[int]) -> None:
    await kill_by_exhaustion(queue, "x")
    for n in range(3):
        await queue.enqueue(f"p{n}", {})
    await queue.cancel("p2", "n")
    clock[0] += 1_000
    await queue.enqueue("late", {}, delay_ms=60_000)  # pending but not ready: it has no age yet
    for n in range(4):
        await queue.enqueue(f"l{n}", {})
    stats = await queue.stats()
    assert stats.by_status == {"pending": 7, "leased": 0, "done": 0, "dead": 2}
    assert stats.dead_by_reason == {"cancelled": 1, "exhausted": 1}
    assert stats.oldest_ready_age_ms == 1_000  # p0, enqueued at T0
    assert stats.leases == []

    a = await queue.claim("owner-a", limit=2, lease_ms=5_000)  # p0, p1
    clock[0] += 500
    [b0] = await queue.claim("owner-b", limit=1, lease_ms=5_000)  # l0
    await queue.finish(b0, "ok")
    b = await queue.claim("owner-b", limit=2, lease_ms=5_000)  # l1, l2
    clock[0] += 250
    stats = await queue.stats()
    assert stats.now_ms == clock[0]
    assert stats.by_status == {"pending": 2, "leased": 4, "done": 1, "dead": 2}
    assert stats.total == 9
    assert stats.oldest_ready_age_ms == 750  # l3, enqueued at T0 + 1000; "late" is not ready
    assert [(lease.owner, lease.count) for lease in stats.leases] == [("owner-a", 2), ("owner-b", 2)]
    assert [lease.first_expiry_ms for lease in stats.leases] == [a[0].lease_until, b[0].lease_until]
    assert stats.attempts == {0: 2, 1: 4}
    assert stats.expired_leases == 0
    clock[0] += 5_000
    assert (await queue.stats()).expired_leases == 4


# --- the file: schema version and durability -----------------------------------------------------------


async def test_schema_version_is_in_user_version_and_reopen_is_idempotent(path: Path, clock: list[int]) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {"v": 1})
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    schema = read(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    rows = snapshot(path)
    for _ in range(2):
        async with await Queue.open(path, clock=lambda: clock[0]) as queue:
            assert (await queue.get("job")) is not None
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert read(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert snapshot(path) == rows


async def test_a_file_with_a_newer_schema_version_is_refused(path: Path) -> None:
    async with await Queue.open(path) as queue:
        await queue.enqueue("job", {})
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    rows = snapshot(path)
    with pytest.raises(ValueError, match="newer"):
        await Queue.open(path)
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION + 1,)]
    assert snapshot(path) == rows


async def test_open_refuses_an_unknown_durability_and_a_memory_database(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await Queue.open(tmp_path / "q.db", durability="fast")
    assert not (tmp_path / "q.db").exists()
    with pytest.raises(ValueError):
        await Queue.open(":memory:")


SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@pytest.mark.parametrize(
    ("durability", "journal_mode", "synchronous"),
    [("full", "wal", "FULL"), ("full-delete", "delete", "EXTRA"), ("normal", "wal", "NORMAL")],
)
async def test_durability_modes_set_journal_mode_and_synchronous(
    path: Path, durability: str, journal_mode: str, synchronous: str
) -> None:
    async with await Queue.open(path, durability=durability) as queue:
        assert (await queue.describe())["durability"] == durability
        await queue.enqueue("job", {})
        # The journal mode of a file is what an independent connection finds (WAL persists in the file;
        # DELETE is what a fresh connection gets on a file that is not in WAL).
        assert read(path, "PRAGMA journal_mode") == [(journal_mode,)]
        # synchronous belongs to the connection: read it back through the queue's own connection.
        async with queue.transaction() as tx:
            [(level,)] = await tx.execute("PRAGMA synchronous")
            [(mode,)] = await tx.execute("PRAGMA journal_mode")
        assert SYNCHRONOUS[level] == synchronous
        assert mode == journal_mode


async def test_reopening_with_another_durability_switches_the_journal_mode(path: Path) -> None:
    async with await Queue.open(path, durability="full") as queue:
        await queue.enqueue("job", {})
    assert read(path, "PRAGMA journal_mode") == [("wal",)]
    async with await Queue.open(path, durability="full-delete") as queue:
        assert (await queue.get("job")) is not None
    assert read(path, "PRAGMA journal_mode") == [("delete",)]


# --- transaction(): the app's rows and the jobs commit together -------------------------------------


async def make_orders_table(queue: Queue) -> None:
    async with queue.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")


async def test_transaction_commits_the_apps_rows_and_the_jobs_together(queue: Queue, path: Path) -> None:
    await make_orders_table(queue)
    async with queue.transaction() as tx:
        await tx.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))
        assert await tx.enqueue("mail-o1", {"order": "o1"}) is True
        assert await tx.enqueue("mail-o1", {"order": "o1"}) is False
        assert await tx.execute("SELECT count(*) FROM asyncq_jobs") == [(1,)]
    assert read(path, "SELECT * FROM orders") == [("o1", 100)]
    assert read(path, "SELECT id, status FROM asyncq_jobs") == [("mail-o1", "pending")]


async def test_transaction_rolls_back_both_when_the_block_raises(queue: Queue, path: Path) -> None:
    await make_orders_table(queue)
    before = snapshot(path)
    with pytest.raises(RuntimeError, match="payment declined"):
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))
            await tx.enqueue("mail-o1", {"order": "o1"})
            raise RuntimeError("payment declined")
    assert read(path, "SELECT * FROM orders") == []
    assert snapshot(path) == before
    with pytest.raises(Conflict):  # a conflicting enqueue inside the block rolls the app's row back too
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (?, ?)", ("o2", 5))
            await tx.enqueue("mail-o2", {"order": "o2"})
            await tx.enqueue("mail-o2", {"order": "other"})
    assert read(path, "SELECT * FROM orders") == []
    assert snapshot(path) == before
    await queue.enqueue("after", {})  # the connection is usable again
    assert [r[0] for r in read(path, "SELECT id FROM asyncq_jobs")] == ["after"]


async def test_transaction_wakes_idle_workers_only_after_commit(queue: Queue) -> None:
    waiter = asyncio.create_task(queue.wait_for_rows(10))
    await asyncio.sleep(0)  # let the waiter register (one loop step; not a timing assumption)
    async with queue.transaction() as tx:
        await tx.enqueue("job", {})
        await asyncio.sleep(0)
        assert not waiter.done()
    async with asyncio.timeout(2):
        await waiter


def app_connection(path: Path) -> sqlite3.Connection:
    """An application's connection in Python's default (legacy) transaction mode."""
    con = sqlite3.connect(path, timeout=5)
    assert con.isolation_level is not None  # implicit BEGIN before DML; the app calls commit() or rollback()
    con.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    return con


@pytest.mark.parametrize("queue_file_exists", [True, False])
async def test_enqueue_sync_rolls_back_and_commits_with_the_callers_transaction(
    path: Path, queue_file_exists: bool
) -> None:
    if queue_file_exists:
        await (await Queue.open(path)).close()
    con = app_connection(path)
    try:
        con.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))  # opens the implicit transaction
        assert con.in_transaction
        assert enqueue_sync(con, "mail-o1", {"order": "o1"}) is True
        assert con.in_transaction  # joined the caller's transaction, did not commit it
        con.rollback()
        assert read(path, "SELECT * FROM orders") == []
        if queue_file_exists:
            assert read(path, "SELECT * FROM asyncq_jobs") == []
        else:  # the tables enqueue_sync created in the caller's transaction rolled back with it
            assert read(path, "SELECT name FROM sqlite_master WHERE name LIKE 'asyncq%'") == []
            assert read(path, "PRAGMA user_version") == [(0,)]

        con.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))
        assert enqueue_sync(con, "mail-o1", {"order": "o1"}) is True
        assert read(path, "SELECT * FROM orders") == []  # nothing visible before the caller commits
        con.commit()
    finally:
        con.close()
    assert read(path, "SELECT * FROM orders") == [("o1", 100)]
    assert read(path, "SELECT id, status FROM asyncq_jobs") == [("mail-o1", "pending")]
    assert read(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    async with await Queue.open(path) as queue:
        [ticket] = await queue.claim("w1")
        assert ticket.body == {"order": "o1"}


async def test_enqueue_sync_without_an_open_transaction_commits_its_own(path: Path) -> None:
    con = app_connection(path)
    try:
        con.commit()
        assert enqueue_sync(con, "job", [1], now_ms=T0) is True
        assert not con.in_transaction
        assert enqueue_sync(con, "job", [1], now_ms=T0 + 1) is False
        with pytest.raises(Conflict):
            enqueue_sync(con, "job", [2], now_ms=T0)
        with pytest.raises(ValueError):
            enqueue_sync(con, "job", [1], max_attempts=True)
        assert not con.in_transaction
    finally:
        con.close()
    assert read(path, "SELECT id, available_at FROM asyncq_jobs") == [("job", T0)]


# --- cancellation --------------------------------------------------------------------------------------


async def test_a_task_cancelled_inside_a_transaction_leaves_no_lock_behind(queue: Queue, path: Path) -> None:
    await make_orders_table(queue)
    inside = asyncio.Event()

    async def hold_a_transaction() -> None:
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 1))
            await tx.enqueue("job", {})
            inside.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(hold_a_transaction())
    async with asyncio.timeout(5):
        await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    other = sqlite3.connect(path, timeout=1, isolation_level=None)
    try:
        started = time.monotonic()
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO orders VALUES (?, ?)", ("o2", 2))
        other.execute("COMMIT")
        assert time.monotonic() - started < 1
    finally:
        other.close()
    assert read(path, "SELECT id FROM orders") == [("o2",)]  # the cancelled block's row rolled back
    assert read(path, "SELECT * FROM asyncq_jobs") == []
    assert await queue.enqueue("after", {}) is True


class Gate:
    """A SQL function that, once armed, blocks its next caller (the connection's thread, mid-statement) until
    released; a temporary trigger calls it on every update of a job row."""

    def __init__(self) -> None:
        self.armed, self.entered, self.release = False, threading.Event(), threading.Event()

    def __call__(self) -> int:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(10), "gate never released"
        return 0

    def install(self, queue: Queue) -> None:
        con = raw_connection(queue)
        con.create_function("gate", 0, self)
        con.execute("CREATE TEMP TRIGGER gate AFTER UPDATE ON asyncq_jobs BEGIN SELECT gate(); END")


@pytest.mark.parametrize(("outcome", "status"), [("ok", "done"), ("retry", "pending"), ("permanent", "dead")])
async def test_a_cancelled_finish_is_reconciled_from_the_row(
    path: Path, clock: list[int], outcome: str, status: str
) -> None:
    gate = Gate()
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {})
        [ticket] = await queue.claim("w1", lease_ms=10_000)
        assert await queue.reconcile(ticket) is None  # still held: no finish has landed
        gate.install(queue)

        gate.armed = True
        finishing = asyncio.create_task(queue.finish(ticket, outcome))
        assert await asyncio.to_thread(gate.entered.wait, 5)  # the finish is running in the connection's thread
        finishing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await finishing
        gate.release.set()  # the call runs on to its COMMIT although nobody awaits it

        assert await queue.reconcile(ticket) == status
    assert job_row(path, "job")["status"] == status


async def test_reconcile_reports_a_lost_lease_as_not_landed(queue: Queue, clock: list[int]) -> None:
    await queue.enqueue("job", {})
    [ticket] = await queue.claim("w1", lease_ms=1_000)
    clock[0] += 1_000
    [taken] = await queue.claim("w2", lease_ms=1_000)
    assert await queue.finish(ticket, "ok") is None
    assert await queue.reconcile(ticket) is None
    assert await queue.reconcile(replace(taken, fence=taken.fence._replace(token=99))) is None


async def test_a_task_cancelled_while_its_begin_waits_for_the_lock_leaves_no_transaction_open(
    queue: Queue, path: Path
) -> None:
    blocker = sqlite3.connect(path, timeout=1, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock: BEGIN waits in busy_timeout
    asking = asyncio.Event()

    async def wants_a_transaction() -> None:
        asking.set()
        async with queue.transaction() as tx:
            await tx.enqueue("never", {})

    task = asyncio.create_task(wants_a_transaction())
    await asking.wait()
    await asyncio.sleep(0)  # one loop step: the task is now awaiting its BEGIN IMMEDIATE
    task.cancel()
    blocker.execute("COMMIT")  # the cancelled BEGIN, still running in the connection's thread, gets the lock
    blocker.close()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(2):  # well inside the 5 s busy timeout the BEGIN was waiting in
            await task

    assert await queue.enqueue("after", {}) is True  # the connection has no transaction left open
    other = sqlite3.connect(path, timeout=1, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("COMMIT")
    finally:
        other.close()
    assert [r[0] for r in read(path, "SELECT id FROM asyncq_jobs")] == ["after"]


# A statement that keeps the connection's thread busy for a while (≈0.1-0.3 s), so that a COMMIT queued
# behind it is still waiting when the test cancels the task awaiting it.
BUSY_QUERY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000) SELECT count(*) FROM c"


async def test_a_task_cancelled_while_committing_stays_cancelled_and_the_outcome_is_read_back(
    queue: Queue, path: Path
) -> None:
    await make_orders_table(queue)
    committing = asyncio.Event()
    busy: list[asyncio.Task[list[Any]]] = []

    async def place_order() -> None:
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (?, ?)", ("o1", 100))
            await tx.enqueue("mail-o1", {"order": "o1"})
            busy.append(asyncio.create_task(tx.execute(BUSY_QUERY)))
            await asyncio.sleep(0)  # the busy statement is queued in the connection's thread
            committing.set()  # no await between here and the COMMIT being queued behind it

    task = asyncio.create_task(place_order())
    await committing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # not an error from a ROLLBACK after the COMMIT
        await task
    assert await busy[0] == [(1_000_000,)]

    # The outcome is unknown to the cancelled task; reading the rows tells. Either way, both or neither.
    orders = read(path, "SELECT id FROM orders")
    jobs = read(path, "SELECT id FROM asyncq_jobs")
    assert (orders, jobs) in [([("o1",)], [("mail-o1",)]), ([], [])]
    other = sqlite3.connect(path, timeout=1, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("COMMIT")
    finally:
        other.close()
    assert await queue.enqueue("after", {}) is True


async def test_a_version_1_file_is_migrated_forward_with_its_jobs(path: Path) -> None:
    """A file made by schema version 1 (its full indexes) opens as the current version, rows kept, and its
    lifecycle statements then seek the partial indexes."""
    from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION

    con = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:
        con.execute(statement)
    con.execute(
        "INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
        " deadline) VALUES ('old', 'default', '{}', 'pending', 0, 3, 0, 0, 9999999999999)"
    )
    con.execute("PRAGMA user_version = 1")
    con.close()
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        [ticket] = await queue.claim("w1")
        assert ticket.id == "old"
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) and SCHEMA_VERSION == 3
        indexes = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "asyncq_jobs_ready" not in indexes and "asyncq_jobs_pending" in indexes
    finally:
        con.close()


# --- the pool's group commit: statements on the loop's thread between BEGIN and COMMIT ------------------


def raw_connection(queue: Queue) -> sqlite3.Connection:
    """The SQLite driver's own connection under ``queue`` (these tests are of that driver)."""
    return queue.store._file.conn._conn  # type: ignore[attr-defined, no-any-return]


def busy_timeout_ms(queue: Queue) -> int:
    return int(raw_connection(queue).execute("PRAGMA busy_timeout").fetchone()[0])


async def test_settle_and_claim_waits_in_the_thread_for_a_lock_another_connection_holds(
    queue: Queue, path: Path
) -> None:
    await queue.enqueue("job", {})
    timeout_before = busy_timeout_ms(queue)
    blocker = sqlite3.connect(path, timeout=1, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process's writer: the try without waiting finds it busy
    claiming = asyncio.create_task(queue.settle_and_claim([], "w1", [("default", 1)]))
    await asyncio.sleep(0.2)
    assert not claiming.done()  # waiting for the lock in the connection's thread, the loop still running
    blocker.execute("COMMIT")
    blocker.close()
    async with asyncio.timeout(5):
        statuses, [ticket] = await claiming
    assert (statuses, ticket.id, ticket.token) == ([], "job", 1)
    assert busy_timeout_ms(queue) == timeout_before  # the try without waiting put the timeout back
    assert not raw_connection(queue).in_transaction


async def test_settle_and_claim_past_the_busy_timeout_is_locked_and_changes_nothing(
    path: Path, clock: list[int]
) -> None:
    async with await Queue.open(str(path), clock=lambda: clock[0], busy_timeout=0.2) as queue:
        await queue.enqueue("job", {})
        [ticket] = await queue.claim("w1")
        before = snapshot(path)
        blocker = sqlite3.connect(path, timeout=1, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                await queue.settle_and_claim([(ticket, "ok", 0)], "w1", [("default", 1)])
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert snapshot(path) == before
        assert not raw_connection(queue).in_transaction
        assert busy_timeout_ms(queue) == 200
        assert await queue.settle_and_claim([(ticket, "ok", 0)], "w1", [("default", 1)]) == (["done"], [])


async def test_a_failing_statement_in_the_group_commit_rolls_the_whole_cycle_back(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    await queue.enqueue_many([JobSpec("a", {}), JobSpec("b", {})])
    [ticket] = await queue.claim("w1", limit=1)
    before = snapshot(path)
    # A trigger makes the claim's UPDATE fail after the finish has run in the same transaction.
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(
        "CREATE TRIGGER refuse AFTER UPDATE OF owner ON asyncq_jobs WHEN NEW.owner = 'w2' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    )
    other.close()
    with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
        await queue.settle_and_claim([(ticket, "ok", 0)], "w2", [("default", 1)])
    assert snapshot(path) == before  # the finish of "a" rolled back with the refused claim of "b"
    assert not raw_connection(queue).in_transaction
