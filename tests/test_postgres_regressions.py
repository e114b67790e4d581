"""Failures the PostgreSQL queues before asyncq reported, each replayed on the real server against asyncq's
store (two ``Queue`` facades with pools of their own stand for two hosts):

- River #1302: a job rescued while its worker still runs; the old worker's finish must be rejected.
- Oban's Lifeline duplicates: a rescue racing a slow completion; exactly one of them may win.
- pgqueuer #430: a heartbeat (lease renewal) racing the completion of the same job.
- procrastinate's stalled jobs: a worker process SIGKILLed mid-job; another worker picks the job up, no operator.
- Hosts whose clocks differ: a worker whose clock runs 2 s behind overwrites nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from waiting import eventually, exited

from asyncq import Queue
from asyncq.core.jobs import JobSpec, Ticket
from asyncq.store.postgres.connection import parse_url
from asyncq.worker.pool import JobContext, Pool

try:
    import pool_children
except ImportError:  # tests/ imported as a package
    from tests import pool_children

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000


class Host:
    """One host: its own facade (its own connection pool) and its own clock, which the test moves."""

    def __init__(self, queue: Queue, clock: list[int]) -> None:
        self.queue, self.clock = queue, clock


@pytest.fixture
async def hosts(postgres_url: str) -> AsyncIterator[tuple[Host, Host]]:
    clocks = [T0], [T0]
    first = await Queue.open(postgres_url, clock=lambda: clocks[0][0])
    second = await Queue.open(postgres_url, clock=lambda: clocks[1][0])
    try:
        yield Host(first, clocks[0]), Host(second, clocks[1])
    finally:
        await first.close()
        await second.close()


# -- River #1302 --------------------------------------------------------------------------------------------


async def test_river_1302_a_job_rescued_while_its_worker_runs_rejects_the_old_workers_finish(
    hosts: tuple[Host, Host],
) -> None:
    a, b = hosts
    await a.queue.enqueue_many([JobSpec("slow", {}), JobSpec("swept", {}, ttl=2)])
    old, old_swept = await a.queue.claim("worker-a", limit=2, lease=1)
    b.clock[0] = a.clock[0] = T0 + 1_000  # the lease ran out while worker a's handler still runs
    [rescued] = await b.queue.claim("worker-b", lease=30)
    assert (rescued.id, rescued.token, rescued.attempt) == ("slow", 2, 2)
    for now in (T0 + 1_100, T0 + 500):  # a finishes late, or with a clock that says it is still in time
        a.clock[0] = now
        assert await a.queue.finish(old, "ok") is None
        assert await a.queue.finish(old, "retry", delay=0) is None
        assert await a.queue.extend(old) is None
        assert await a.queue.release_many([old]) == [False]
    job = await a.queue.get("slow")
    assert job is not None and (job.status, job.owner, job.token, job.attempts) == ("leased", "worker-b", 2, 2)
    b.clock[0] = T0 + 1_200
    assert await b.queue.finish(rescued, "ok") == "done"
    # Rescued by the sweep instead (deadline passed while its worker ran): the late finish changes nothing either.
    b.clock[0] = a.clock[0] = T0 + 2_000
    assert await b.queue.claim("worker-b") == []
    assert await a.queue.finish(old_swept, "ok") is None
    swept = await a.queue.get("swept")
    assert swept is not None and (swept.status, swept.reason, swept.token) == ("dead", "deadline", 1)


# -- Oban Lifeline duplicates -------------------------------------------------------------------------------


async def test_oban_lifeline_a_rescue_waiting_on_a_slow_completion_lets_exactly_one_win(
    hosts: tuple[Host, Host], postgres_url: str
) -> None:
    a, b = hosts
    await a.queue.enqueue_many([JobSpec("first", {}), JobSpec("second", {})])
    first, second = await a.queue.claim("worker-a", limit=2, lease=1)
    schema = parse_url(postgres_url).schema
    # The completion's transaction is slow: the job's row is locked (a blocker stands for it) when the rescue
    # comes. The rescue skips the locked row; the completion lands when the lock goes.
    blocker = await asyncpg.connect(parse_url(postgres_url).dsn)
    try:
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(f"SELECT 1 FROM {schema}.jobs WHERE id = 'first' FOR UPDATE")
        a.clock[0], b.clock[0] = T0 + 999, T0 + 1_000
        completion = asyncio.create_task(a.queue.finish(first, "ok"))
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        await eventually(
            lambda: blocker.fetchval(waiting),
            "the completion's statement to wait on the blocker's row lock",
            timeout=5,
            stop=lambda: "the completion ended without waiting" if completion.done() else None,
        )
        rescued = await b.queue.claim("worker-b", limit=5)
        assert [t.id for t in rescued] == ["second"]  # "first" is held by its completion: skipped, not waited for
        assert not completion.done()
        await lock.rollback()
    finally:
        await blocker.close()
    assert await completion == "done"
    # The other order: the rescue commits first, and the slow completion then finds another lease.
    a.clock[0] = T0 + 999
    assert await a.queue.finish(second, "ok") is None
    jobs = {job.id: job for job in await a.queue.list_jobs()}
    assert (jobs["first"].status, jobs["first"].token) == ("done", 1)
    assert (jobs["second"].status, jobs["second"].owner, jobs["second"].token) == ("leased", "worker-b", 2)


async def test_oban_lifeline_rescues_racing_completions_never_both_win(hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    n = 120
    await a.queue.enqueue_many([JobSpec(f"j{i:03d}", {}) for i in range(n)])
    tickets = await a.queue.claim("worker-a", limit=n, lease=1)
    a.clock[0], b.clock[0] = T0 + 999, T0 + 1_000  # a's finishes are in time; b sees every lease expired
    random.Random(1302).shuffle(tickets)

    async def rescue() -> list[Ticket]:
        taken: list[Ticket] = []
        for _ in range(n):
            taken += await b.queue.claim("worker-b", limit=3, lease=30)
            await asyncio.sleep(0)
        return taken

    finished, rescued = await asyncio.gather(asyncio.gather(*(a.queue.finish(t, "ok") for t in tickets)), rescue())
    done = {t.id for t, status in zip(tickets, finished, strict=True) if status == "done"}
    taken = {t.id for t in rescued}
    assert len(rescued) == len(taken)  # no job rescued twice
    assert not done & taken and done | taken == {t.id for t in tickets}  # exactly one winner each
    assert all(status in ("done", None) for status in finished)
    stored = {job.id: job for job in await a.queue.list_jobs(limit=1000)}
    assert all(stored[i].status == "done" and stored[i].token == 1 for i in done)
    assert all(stored[i].status == "leased" and stored[i].owner == "worker-b" for i in taken)


# -- pgqueuer #430 ------------------------------------------------------------------------------------------


async def test_pgqueuer_430_a_heartbeat_racing_the_completion_lands_one_of_them_never_a_mix(
    hosts: tuple[Host, Host],
) -> None:
    a, b = hosts  # the heartbeat from one connection pool, the completion from another, as two tasks would
    n = 100
    await a.queue.enqueue_many([JobSpec(f"j{i:03d}", {}) for i in range(n)])
    tickets = await a.queue.claim("worker-a", limit=n, lease=10)
    a.clock[0] = b.clock[0] = T0 + 5_000
    beats, ends = await asyncio.gather(
        asyncio.gather(*(a.queue.extend(t, lease=10) for t in tickets)),
        asyncio.gather(*(b.queue.finish(t, "ok") for t in tickets)),
    )
    for ticket, beat, end in zip(tickets, beats, ends, strict=True):
        assert (beat is None) != (end is None), (ticket.id, beat, end)  # exactly one landed
        job = await a.queue.get(ticket.id)
        assert job is not None
        if end == "done":
            assert (job.status, job.lease_until) == ("done", None)
        else:
            assert beat is not None and (job.status, job.lease_until) == ("leased", T0 + 15_000)
            assert await b.queue.finish(beat, "ok") == "done"  # the renewed ticket still completes it
    assert (await a.queue.stats()).by_status["done"] == n


async def test_pgqueuer_430_a_pool_renewing_leases_while_jobs_complete_loses_none(postgres_url: str) -> None:
    n = 60
    starts: dict[str, int] = {}
    rng = random.Random(430)

    async def handle(body: Any, context: JobContext) -> None:
        starts[context.id] = starts.get(context.id, 0) + 1
        await asyncio.sleep(rng.uniform(0.1, 0.9))  # around the renewal every lease/4 = 300 ms

    async with await Queue.open(postgres_url) as queue:
        await queue.enqueue_many([JobSpec(f"j{i:03d}", {}) for i in range(n)])
        # A lease of 1.2 s, not less: a loaded machine can stall the loop past a shorter one (a lost lease re-runs).
        pool = Pool(queue, owner="w", concurrency=16, lease=1.2)
        pool.register("default", handle)
        await pool.run(burst=True)
        stats = await queue.stats()
    assert stats.by_status == {"pending": 0, "leased": 0, "done": n, "dead": 0, "waiting": 0}
    assert starts == {f"j{i:03d}": 1 for i in range(n)}
    assert (pool.counters.stale_finishes, pool.counters.leases_lost) == (0, 0)


# -- procrastinate's stalled jobs ---------------------------------------------------------------------------


def _effects(path: Path, statement: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path, timeout=10)
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()


async def test_procrastinate_a_worker_killed_mid_job_leaves_it_to_another_worker_without_an_operator(
    postgres_url: str, tmp_path: Path
) -> None:
    async with await Queue.open(postgres_url) as queue:
        await queue.enqueue("stalled", {"n": 1})
    effects = tmp_path / "effects.db"
    pool_children.open_effects(effects).close()
    script = str(Path(pool_children.__file__).resolve())

    def start(owner: str, handler_seconds: float) -> subprocess.Popen[bytes]:
        argv = [sys.executable, script, "worker", "--db", postgres_url, "--effects", str(effects), "--owner", owner]
        argv += ["--lease-ms", "1000", "--handler-seconds", str(handler_seconds), "--poll-max", "0.1"]
        return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    procs = [start("doomed", 60)]
    try:
        await eventually(
            lambda: _effects(effects, "SELECT count(*) FROM started")[0][0] == 1,
            "a start",
            timeout=20,
            stop=exited(procs, expected=[-signal.SIGKILL]),
        )
        procs[0].send_signal(signal.SIGKILL)  # mid-job: its lease is never renewed nor finished again
        procs[0].wait(timeout=10)
        procs.append(start("rescuer", 0))
        await eventually(
            lambda: _effects(effects, "SELECT count(*) FROM applied")[0][0] == 1,
            "the rescue",
            timeout=20,
            stop=exited(procs, expected=[-signal.SIGKILL]),
        )
        procs[1].send_signal(signal.SIGTERM)
        out, _ = procs[1].communicate(timeout=20)
        assert procs[1].returncode == 0 and json.loads(out)["finished"] == {"done": 1}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
    assert [row[0] for row in _effects(effects, "SELECT owner FROM started ORDER BY seq")] == ["doomed", "rescuer"]
    assert _effects(effects, "SELECT owner, count FROM applied") == [("rescuer", 1)]
    async with await Queue.open(postgres_url, read_only=True) as reader:
        job = await reader.get("stalled")
    assert job is not None and (job.status, job.attempts, job.token, job.redrives) == ("done", 2, 2, 0)


# -- clocks that differ -------------------------------------------------------------------------------------


async def test_a_worker_whose_clock_runs_2_s_behind_overwrites_nothing(hosts: tuple[Host, Host]) -> None:
    on_time, behind = hosts
    behind.clock[0] = T0 - 2_000
    await on_time.queue.enqueue("fresh", {}, queue="other")  # available at T0 by the clock that enqueued it
    assert await behind.queue.claim("behind", queue="other") == []  # the host behind waits up to its lag for it
    on_time.clock[0] = T0 - 5_000
    await on_time.queue.enqueue_many([JobSpec("a", {}), JobSpec("b", {})])
    on_time.clock[0] = T0
    # The host behind claims "a" with a 1 s lease: by the true clock it expired a second ago.
    [late] = await behind.queue.claim("behind", lease=1)
    assert late.lease_until == T0 - 1_000
    [taken] = await on_time.queue.claim("on-time", lease=1)
    assert (taken.id, taken.token) == ("a", 2)
    behind.clock[0] = T0 - 1_500  # still inside its own lease, by its own clock
    assert await behind.queue.finish(late, "ok") is None
    assert await behind.queue.extend(late) is None
    # A live lease of the host on time ends at T0 + 1000 by its clock: the host behind never sees it expire early.
    for now in (T0 - 2_000, T0 - 1_001, T0 - 1):
        behind.clock[0] = now
        assert "a" not in [t.id for t in await behind.queue.claim("behind", limit=5)]
    assert await behind.queue.finish(late, "ok") is None  # its old ticket, at any of its times
    job = await on_time.queue.get("a")
    assert job is not None and (job.status, job.owner, job.token) == ("leased", "on-time", 2)
    on_time.clock[0] = T0 + 500
    assert await on_time.queue.finish(taken, "ok") == "done"
