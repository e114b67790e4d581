"""The SQLite driver's connection: a cancelled task never leaves a lock or a transaction behind (the call runs to
its end in the connection's thread), and the pool's group commit runs its statements on the loop's thread between
a ``BEGIN IMMEDIATE`` and a ``COMMIT`` sent to that thread. A write that finds the lock held elsewhere waits in short
sleeps up to the busy timeout; a group commit that met another connection's lock and drained the queue spaces the
next one. Moved from ``tests/test_queue.py``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from holding import Holding
from waiting import eventually

from asyncq.core.jobs import JobSpec
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.sqlite import aio, queue_store
from asyncq.store.sqlite.busy import RETRY_MAX_S, RETRY_MIN_S, TimedConnection, begin_immediate, set_waiting
from asyncq.worker.pool import Pool

from .sqlite_files import assert_counts_kept, job_row, read, snapshot

pytestmark = pytest.mark.timeout(20)


# --- cancellation --------------------------------------------------------------------------------------


async def make_orders_table(queue: Queue) -> None:
    async with queue.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")


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
        [ticket] = await queue.claim("w1", lease=10)
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


# --- the pool's group commit: statements on the loop's thread between BEGIN and COMMIT ------------------


def raw_connection(queue: Queue) -> sqlite3.Connection:
    """The SQLite driver's own connection under ``queue`` (these tests are of that driver)."""
    return queue.store._file.conn._conn  # type: ignore[attr-defined, no-any-return]


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """The names of the coroutines ``task`` is suspended in, outermost first."""
    names, coro = [], task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_name)
        coro = coro.cr_await
    return names


async def busy_timeout_ms(queue: Queue) -> int:
    """The busy timeout a call that may wait runs with (a write in WAL mode leaves it at 0 until one does)."""
    read = lambda con: int(con.execute("PRAGMA busy_timeout").fetchone()[0])  # noqa: E731
    return int(await queue.store._file.run(read))  # type: ignore[attr-defined]


async def test_settle_and_claim_waits_in_the_thread_for_a_lock_another_connection_holds(
    queue: Queue, path: Path
) -> None:
    await queue.enqueue("job", {})
    timeout_before = await busy_timeout_ms(queue)
    blocker = sqlite3.connect(path, timeout=1, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process's writer: the try without waiting finds it busy
    claiming = asyncio.create_task(queue.settle_and_claim([], "w1", [("default", 1)]))
    await eventually(lambda: "_begin_in_turn" in awaiting(claiming), "the claim to try its BEGIN again in turn")
    assert not claiming.done()  # waiting for the lock, the loop still running
    blocker.execute("COMMIT")
    blocker.close()
    async with asyncio.timeout(5):
        statuses, [ticket] = await claiming
    assert (statuses, ticket.id, ticket.token) == ([], "job", 1)
    assert await busy_timeout_ms(queue) == timeout_before  # the try without waiting put the timeout back
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
        assert await busy_timeout_ms(queue) == 200
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


# --- a write that finds the lock held elsewhere waits in short sleeps, up to the busy timeout ---------------


def connected(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    return con


def test_a_write_waits_for_a_lock_held_elsewhere_in_short_sleeps_then_begins(path: Path) -> None:
    blocker, writer = connected(path, 1), connected(path, 5)
    blocker.execute("BEGIN IMMEDIATE")  # another process's commit in progress
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)
        if len(sleeps) == 20:
            blocker.execute("COMMIT")  # the commit lands while the writer waits

    try:
        begin_immediate(writer, sleep)
        assert writer.in_transaction
        writer.execute("COMMIT")
    finally:
        blocker.close()
        writer.close()
    assert len(sleeps) == 20  # it began at its first try after the lock was free
    assert sleeps[0] == RETRY_MIN_S  # not SQLite's busy handler, whose first sleep is a millisecond
    assert sleeps == sorted(sleeps) and max(sleeps) <= RETRY_MAX_S  # an eighth of the time waited, growing


def test_a_write_whose_timeout_a_wal_write_left_off_still_waits_for_a_lock_held_elsewhere(path: Path) -> None:
    """Its first ``BEGIN`` is tried at once, with no setup; a busy answer falls through to the short sleeps."""
    blocker = connected(path, 1)
    writer = sqlite3.connect(path, timeout=5, isolation_level=None, factory=TimedConnection)
    writer.wal = True
    set_waiting(writer, False)  # as the WAL write before this one left it
    blocker.execute("BEGIN IMMEDIATE")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)
        if len(sleeps) == 5:
            blocker.execute("COMMIT")

    try:
        begin_immediate(writer, sleep)
        assert writer.in_transaction and len(sleeps) == 5
        writer.execute("COMMIT")
        assert writer.waiting is False and writer.execute("PRAGMA busy_timeout").fetchone() == (0,)  # left off
        begin_immediate(writer, sleep)  # the lock free: begun at the first try, no sleep
        assert writer.in_transaction and len(sleeps) == 5
        writer.execute("ROLLBACK")
    finally:
        blocker.close()
        writer.close()


def test_a_write_past_the_busy_timeout_raises_sqlites_busy_error_and_leaves_the_connection_as_it_was(
    path: Path,
) -> None:
    blocker, writer = connected(path, 1), connected(path, 0.05)
    blocker.execute("BEGIN IMMEDIATE")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked") as raised:
            begin_immediate(writer, sleep)
        assert raised.value.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
        assert not writer.in_transaction
        assert writer.execute("PRAGMA busy_timeout").fetchone() == (50,)  # put back
        assert sleeps and max(sleeps) <= RETRY_MAX_S and sum(sleeps) <= 0.05  # the tries fit in the timeout
        tried = len(sleeps)
        writer.execute("PRAGMA busy_timeout = 0")
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            begin_immediate(writer, sleep)  # no busy timeout: the busy error at once
        assert len(sleeps) == tried and not writer.in_transaction
    finally:
        blocker.close()
        writer.close()


def waiting_in(function: str) -> bool:
    """Whether some thread of this process is inside ``function`` now."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back  # type: ignore[assignment]
    return False


async def test_an_enqueue_waits_for_another_connections_commit_and_lands(queue: Queue, path: Path) -> None:
    blocker = connected(path, 1)
    blocker.execute("BEGIN IMMEDIATE")
    enqueueing = asyncio.create_task(queue.enqueue("job", {}))
    try:
        await eventually(lambda: waiting_in("begin_immediate"), "the enqueue to wait for the lock in its thread")
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    async with asyncio.timeout(5):
        assert await enqueueing is True
    assert not raw_connection(queue).in_transaction
    assert await busy_timeout_ms(queue) == 5000
    assert job_row(path, "job")["status"] == "pending"


# --- a group commit that met another connection's lock and drained the queue spaces the next one ------------


async def claim_while_another_connection_commits(queue: Queue, path: Path, wants: int) -> list[str]:
    """A group commit whose BEGIN finds the lock held by another connection, which then commits."""
    blocker = connected(path, 1)
    blocker.execute("BEGIN IMMEDIATE")
    claiming = asyncio.create_task(queue.settle_and_claim([], "w1", [("default", wants)]))
    try:
        await eventually(lambda: "_begin_in_turn" in awaiting(claiming), "the claim to wait for the lock in turn")
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    async with asyncio.timeout(5):
        _, tickets = await claiming
    return [ticket.id for ticket in tickets]


async def test_after_a_contended_group_commit_that_drained_the_queue_the_next_one_waits_its_spacing(
    queue: Queue, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spaced by a second here, not 10 ms: the enqueue between the two claims took longer than that under load.
    monkeypatch.setattr(queue_store, "CONTENDED_CLAIM_SPACING_S", 1.0)
    await queue.enqueue("first", {})
    assert await claim_while_another_connection_commits(queue, path, wants=5) == ["first"]  # short: drained
    await queue.enqueue("second", {})
    spaced = asyncio.create_task(queue.settle_and_claim([], "w1", [("default", 5)]))
    await eventually(
        lambda: awaiting(spaced)[-2:] == ["run_held", "sleep"], "the next group commit to wait out its spacing"
    )
    async with asyncio.timeout(5):
        _, [ticket] = await spaced
    assert ticket.id == "second"
    assert not raw_connection(queue).in_transaction


@pytest.mark.parametrize("contended", [False, True])
async def test_a_group_commit_that_claimed_all_it_asked_or_met_no_lock_spaces_nothing(
    queue: Queue, path: Path, contended: bool
) -> None:
    for n in range(3):
        await queue.enqueue(f"job-{n}", {})
    if contended:  # a backlog: the claim came back full although another connection held the lock
        assert await claim_while_another_connection_commits(queue, path, wants=2) == ["job-0", "job-1"]
    else:  # the queue drained, but nobody else held the lock
        _, tickets = await queue.settle_and_claim([], "w1", [("default", 5)])
        assert len(tickets) == 3
    await queue.enqueue("next", {})
    at_once = asyncio.create_task(queue.settle_and_claim([], "w1", [("default", 5)]))
    async with asyncio.timeout(5):
        while not at_once.done():
            assert "sleep" not in awaiting(at_once)
            await asyncio.sleep(0)
    assert "next" in [ticket.id for ticket in at_once.result().tickets]


# --- an enqueue made while the pool's group commit waits for the lock rides in its transaction -----------------


class Contended:
    """A group commit (``settle_and_claim``) waiting for the write lock another connection holds, until ``free``."""

    def __init__(self, queue: Queue, path: Path, owner: str = "w1") -> None:
        self.blocker = connected(path, 1)
        self.blocker.execute("BEGIN IMMEDIATE")
        self.claiming = asyncio.create_task(queue.settle_and_claim([], owner, [("default", 5)]))

    async def waiting(self) -> None:
        await eventually(lambda: "_begin_in_turn" in awaiting(self.claiming), "the group commit to wait in turn")

    def free(self) -> None:
        self.blocker.execute("COMMIT")
        self.blocker.close()


async def boarded(queue: Queue, call: Any) -> asyncio.Task[Any]:
    task = asyncio.create_task(call)
    await eventually(lambda: awaiting(task)[-1:] == ["write_or_ride"], "the enqueue to ride the group commit")
    return task


async def test_an_enqueue_made_while_a_group_commit_waits_for_the_lock_shares_its_commit_and_is_claimed_in_it(
    queue: Queue, path: Path
) -> None:
    await queue.enqueue("a", {})
    contended = Contended(queue, path)
    await contended.waiting()
    statements = traced(queue)
    riding = await boarded(queue, queue.enqueue("b", {"n": 1}))
    contended.free()
    async with asyncio.timeout(5):
        assert await riding is True
        _, tickets = await contended.claiming
    assert [ticket.id for ticket in tickets] == ["a", "b"]  # the claim saw the rider's row
    assert statements.count("COMMIT") == 1  # (the BEGINs traced are the group commit's tries in turn)
    assert "SAVEPOINT asyncq_rider" in statements
    assert json.loads(job_row(path, "b")["body"]) == {"n": 1}
    assert not raw_connection(queue).in_transaction
    assert_counts_kept(path)


async def test_a_batch_too_large_to_ride_is_inserted_alone_in_the_connections_thread(
    queue: Queue, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_store, "RIDE_ROWS_MAX", 2)
    contended = Contended(queue, path)
    await contended.waiting()
    statements = traced(queue)
    small = await boarded(queue, queue.enqueue_many([JobSpec("a", {}), JobSpec("b", {})]))
    large = asyncio.create_task(queue.enqueue_many([JobSpec(f"big-{n}", {}) for n in range(3)]))
    await eventually(lambda: "run_write" in awaiting(large), "the large batch to wait for the lock on its own")
    contended.free()
    async with asyncio.timeout(5):
        assert await small == [True, True] and await large == [True] * 3
        _, tickets = await contended.claiming
    assert [ticket.id for ticket in tickets] == ["a", "b"]  # the large batch committed after the group commit
    assert statements.count("SAVEPOINT asyncq_rider") == 1 and statements.count("COMMIT") == 2
    assert [status for (status,) in read(path, "SELECT status FROM asyncq_jobs WHERE id LIKE 'big-%'")] == [
        "pending"
    ] * 3


async def test_a_riding_enqueue_that_is_refused_leaves_nothing_of_its_batch_and_the_group_commit_lands(
    queue: Queue, path: Path
) -> None:
    await queue.enqueue("a", {"n": 1})
    contended = Contended(queue, path)
    await contended.waiting()
    # "fresh" is inserted first, then "a" conflicts: the rider's savepoint takes "fresh" back with it.
    refused = await boarded(queue, queue.enqueue_many([JobSpec("fresh", {}), JobSpec("a", {"n": 2})]))
    fine = await boarded(queue, queue.enqueue("c", {}))
    contended.free()
    async with asyncio.timeout(5):
        with pytest.raises(Conflict, match="different payload"):
            await refused
        assert await fine is True
        _, tickets = await contended.claiming
    assert [ticket.id for ticket in tickets] == ["a", "c"]
    assert read(path, "SELECT id FROM asyncq_jobs WHERE id = 'fresh'") == []
    assert json.loads(job_row(path, "a")["body"]) == {"n": 1}
    assert not raw_connection(queue).in_transaction
    assert_counts_kept(path)


async def test_when_the_group_commit_fails_its_riders_run_alone_and_land(queue: Queue, path: Path) -> None:
    await queue.enqueue("a", {})
    other = sqlite3.connect(path, isolation_level=None)  # the claim's UPDATE fails for owner w2
    other.execute(
        "CREATE TRIGGER refuse AFTER UPDATE OF owner ON asyncq_jobs WHEN NEW.owner = 'w2' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    )
    other.close()
    contended = Contended(queue, path, owner="w2")
    await contended.waiting()
    riding = await boarded(queue, queue.enqueue("b", {}))
    contended.free()
    async with asyncio.timeout(5):
        with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
            await contended.claiming
        assert await riding is True  # rolled back with the group commit, then written alone
    assert [job_row(path, job)["status"] for job in ("a", "b")] == ["pending", "pending"]
    assert not raw_connection(queue).in_transaction
    assert_counts_kept(path)


async def test_a_group_commit_cancelled_during_its_commit_still_tells_its_riders_they_landed(
    queue: Queue, path: Path
) -> None:
    contended = Contended(queue, path)
    await contended.waiting()
    riding = await boarded(queue, queue.enqueue("b", {}))
    loop = asyncio.get_running_loop()

    def cancel_at_commit(statement: str) -> None:  # in the connection's thread, as the COMMIT begins
        if statement == "COMMIT":
            loop.call_soon_threadsafe(contended.claiming.cancel)

    raw_connection(queue).set_trace_callback(cancel_at_commit)
    contended.free()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await contended.claiming
        assert await riding is True  # told it landed, not sent to write again (it would have found its own row)
    raw_connection(queue).set_trace_callback(None)
    assert job_row(path, "b")["status"] == "leased"  # committed whole, with the claim that took it
    assert not raw_connection(queue).in_transaction


async def test_a_rider_cancelled_before_the_group_commit_began_writes_nothing(queue: Queue, path: Path) -> None:
    contended = Contended(queue, path)
    await contended.waiting()
    cancelled = await boarded(queue, queue.enqueue("gone", {}))
    kept = await boarded(queue, queue.enqueue("kept", {}))
    cancelled.cancel()
    contended.free()
    async with asyncio.timeout(5):
        assert await kept is True
        _, tickets = await contended.claiming
    assert cancelled.cancelled()
    assert [ticket.id for ticket in tickets] == ["kept"]
    assert read(path, "SELECT id FROM asyncq_jobs") == [("kept",)]
    assert not raw_connection(queue).in_transaction


# --- an enqueue asks a running pool for a group commit to ride -------------------------------------------------


def hosts(queue: Queue) -> list[Any]:
    return queue.store._file._hosts  # type: ignore[attr-defined, no-any-return]


async def test_an_enqueue_beside_an_idle_pool_commits_with_the_claim_that_takes_it(queue: Queue) -> None:
    started: list[str] = []
    pool = Pool(queue, concurrency=2)
    pool.register("default", lambda body, context: asyncio.sleep(0, started.append(context.id)))
    running = asyncio.create_task(pool.run())
    try:
        await eventually(lambda: bool(queue.store._file._waiters), "the pool to wait for work")  # type: ignore[attr-defined]
        assert len(hosts(queue)) == 1
        statements = traced(queue)
        assert await queue.enqueue("a", {}) is True
        first_commit = statements[: statements.index("COMMIT") + 1]
        assert any(s.strip().startswith("INSERT INTO asyncq_jobs") for s in first_commit), first_commit
        assert any("SET status = 'leased'" in s for s in first_commit), first_commit  # the claim, same commit
        assert "SAVEPOINT asyncq_rider" in first_commit
        await eventually(lambda: started == ["a"], "the handler to run")
    finally:
        pool.stop()
        async with asyncio.timeout(5):
            await running
    assert hosts(queue) == []  # the offer withdrawn with the pool


async def test_an_enqueue_a_host_offered_to_but_did_not_take_up_in_time_runs_alone(queue: Queue, path: Path) -> None:
    asked: list[int] = []
    withdraw = queue.store.host_rides(lambda: asked.append(1) is None)  # says yes, runs nothing
    loop = asyncio.get_running_loop()
    try:
        began = loop.time()
        assert await queue.enqueue("a", {}) is True
        assert loop.time() - began >= aio.RIDE_WAIT_SECONDS
        assert asked == [1]
        assert job_row(path, "a")["status"] == "pending"
    finally:
        withdraw()
    assert hosts(queue) == []


async def test_an_enqueue_a_host_declines_runs_alone_at_once(queue: Queue, path: Path) -> None:
    asked: list[int] = []
    withdraw = queue.store.host_rides(lambda: asked.append(1) is not None)  # no room to claim
    try:
        statements = traced(queue)
        assert await queue.enqueue("a", {}) is True
        assert asked == [1]
        assert statements.count("COMMIT") == 1 and "SAVEPOINT asyncq_rider" not in statements
    finally:
        withdraw()


async def test_a_pool_with_no_room_to_claim_declines_to_host_a_ride(queue: Queue) -> None:
    hold = Holding()
    started, release = hold.started, hold.release
    pool = Pool(queue, concurrency=1, prefetch=0)
    pool.register("default", hold)
    running = asyncio.create_task(pool.run())
    try:
        await queue.enqueue("busy", {})
        async with asyncio.timeout(5):
            await started.wait()
        [offer] = hosts(queue)
        assert offer() is False  # its one slot runs a job and it claims none ahead: nothing to claim a job into
        assert await queue.enqueue("next", {}) is True
    finally:
        release.set()
        pool.stop()
        async with asyncio.timeout(5):
            await running


def traced(queue: Queue) -> list[str]:
    """Every statement the driver's connection runs from now on (SQLite's trace)."""
    statements: list[str] = []
    raw_connection(queue).set_trace_callback(statements.append)
    return statements


async def test_writes_and_group_commits_in_wal_mode_switch_the_busy_timeout_only_for_a_call_that_may_wait(
    queue: Queue,
) -> None:
    """SQLite prepares a ``PRAGMA busy_timeout`` again at every run: a write that switched it to 0 and back spent
    three a call. In WAL mode a write leaves it at 0 (its statements hold the lock, a WAL commit takes no other)."""
    await queue.enqueue("warm", {})
    await queue.get("warm")  # a read: the timeout back in force
    statements = traced(queue)
    await queue.enqueue("a", {})
    await queue.settle_and_claim([], "w1", [("default", 2)])
    await queue.enqueue("b", {})
    [ticket] = await queue.claim("w1")
    assert await queue.finish(ticket, "ok") == "done"
    pragmas = [s for s in statements if "busy_timeout" in s]
    assert pragmas == ["PRAGMA busy_timeout = 0"], statements  # once, at the first write; never back meanwhile
    assert (await queue.get("a")) is not None  # a read puts it back first, once
    assert [s for s in statements if "busy_timeout" in s][1:] == ["PRAGMA busy_timeout = 5000"]
    assert await busy_timeout_ms(queue) == 5000
    assert not raw_connection(queue).in_transaction


async def test_in_delete_mode_every_write_puts_the_busy_timeout_back_at_once(path: Path) -> None:
    """A DELETE-mode commit takes an exclusive lock and may wait for readers: the timeout stays in force for it."""
    async with await Queue.open(str(path), durability="full-delete", busy_timeout=0.3) as queue:
        await queue.enqueue("a", {})
        await queue.settle_and_claim([], "w1", [("default", 1)])
        raw = int(raw_connection(queue).execute("PRAGMA busy_timeout").fetchone()[0])
        assert raw == 300
        assert await queue.enqueue("b", {}) is True
        assert int(raw_connection(queue).execute("PRAGMA busy_timeout").fetchone()[0]) == 300
