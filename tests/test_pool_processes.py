"""Worker pools in real child processes (``tests/pool_children.py``), stopped with real signals.

Each handler records its effect in a SQLite file of its own (``pool_children.open_effects``): a ``started``
row per delivery and one ``applied`` row per job id with a count. "Applied exactly once" is read there:
one ``applied`` row per job, and a count above 1 only for a job whose effect committed while its finish died
with a killed process (an absorbed duplicate, which the tests count and bound). Tests wait by polling files
with a deadline; nothing sleeps to let a child "get ahead".
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import eventually_sync

from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

try:
    import pool_children
except ImportError:  # tests/ imported as a package
    from tests import pool_children

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(pool_children.__file__).resolve()


class Workers:
    """Starts worker processes from outside the repository and kills (by pid) any left at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.db = tmp_path / "queue.db"
        self.effects = tmp_path / "effects.db"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, owner: str, **options: object) -> subprocess.Popen[bytes]:
        argv = [sys.executable, str(SCRIPT), "worker", "--db", str(self.db), "--effects", str(self.effects)]
        argv += ["--owner", owner]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        with open(self.tmp_path / f"{owner}.stderr", "wb") as errors:
            proc = subprocess.Popen(argv, cwd=self.tmp_path, stdout=subprocess.PIPE, stderr=errors)
        self.procs.append(proc)
        return proc

    def stderr(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.tmp_path.glob("*.stderr"))

    def stop(self, proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, dict[str, Any]]:
        """SIGTERM, then the exit code and the counters the worker printed."""
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {proc.pid} still running {timeout}s after SIGTERM\n{self.stderr()}") from None
        counters = json.loads(out) if proc.returncode == 0 else {}
        return proc.returncode, counters

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """``eventually_sync``: fail at the deadline or as soon as a worker dies, with the workers' stderr."""
        eventually_sync(condition, what, timeout=timeout, stop=self.dead, details=self.stderr)

    def dead(self) -> str | None:
        """Which worker has exited, if one has (waiting longer cannot help)."""
        for proc in self.procs:
            if proc.returncode is None and proc.poll() is not None:  # one not reaped by the test itself
                return f"worker {proc.pid} exited {proc.returncode}"
        return None

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path)
    pool_children.open_effects(started.effects).close()
    try:
        yield started
    finally:
        started.kill_all()


def query(path: Path, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path, timeout=10)
    try:
        return con.execute(statement, parameters).fetchall()
    finally:
        con.close()


def count(path: Path, statement: str, parameters: tuple[Any, ...] = ()) -> int:
    return int(query(path, statement, parameters)[0][0])


def enqueue(db: Path, n: int, max_attempts: int = 3) -> None:
    async def add() -> None:
        async with await Queue.open(db) as queue:
            for start in range(0, n, 1000):
                ids = range(start, min(n, start + 1000))
                await queue.enqueue_many(JobSpec(f"job-{i:05d}", {"i": i}, max_attempts=max_attempts) for i in ids)

    asyncio.run(add())


# --- SIGTERM -------------------------------------------------------------------------------------------


def test_sigterm_lets_jobs_in_flight_finish_within_the_grace_period(workers: Workers) -> None:
    enqueue(workers.db, 12)
    worker = workers.start("w1", concurrency=8, handler_seconds=0.5, grace=5, lease_ms=5_000)
    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM started") == 8, 15, "8 jobs in flight")

    signalled = time.time()
    code, counters = workers.stop(worker, timeout=10)
    stopped_after = time.time() - signalled

    assert code == 0, workers.stderr()
    assert stopped_after < 5  # it left as soon as its jobs were done, not at the end of the grace period
    assert counters["finished"] == {"done": 8}
    assert counters["stale_finishes"] == counters["leases_lost"] == 0
    applied = query(workers.effects, "SELECT count, at FROM applied")
    assert len(applied) == 8
    assert all(n == 1 and at > signalled for n, at in applied)  # they were in flight when the signal came
    assert count(workers.effects, "SELECT count(*) FROM started") == 8  # nothing claimed after the signal
    statuses = dict(query(workers.db, "SELECT status, count(*) FROM asyncq_jobs GROUP BY status"))
    assert statuses == {"done": 8, "pending": 4}


def test_jobs_outliving_the_grace_period_are_reclaimed_after_their_lease_by_a_new_process(
    workers: Workers,
) -> None:
    enqueue(workers.db, 6)
    first = workers.start("w1", concurrency=6, handler_seconds=60, grace=0.5, lease_ms=1_500)
    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM started") == 6, 15, "6 jobs in flight")

    code, counters = workers.stop(first, timeout=10)
    assert code == 0, workers.stderr()
    assert counters["finished"] == {}  # cancelled at the end of the grace period, unfinished
    assert query(workers.effects, "SELECT * FROM applied") == []
    leased = query(workers.db, "SELECT owner, token, count(*) FROM asyncq_jobs WHERE status = 'leased' GROUP BY 1, 2")
    assert leased == [("w1", 1, 6)]  # left to expire, not released

    second = workers.start("w2", concurrency=6, handler_seconds=0.05, lease_ms=1_500, poll_max=0.1)
    workers.wait_until(
        lambda: count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'") == 6, 20, "6 jobs done"
    )
    code, counters = workers.stop(second, timeout=10)
    assert code == 0, workers.stderr()
    assert counters["finished"] == {"done": 6}

    # None lost, none finished twice: each job applied once, by the second worker, under token 2.
    assert query(workers.effects, "SELECT owner, token, count, count(*) FROM applied GROUP BY 1, 2, 3") == [
        ("w2", 2, 1, 6)
    ]
    assert query(workers.db, "SELECT status, attempts, token, count(*) FROM asyncq_jobs GROUP BY 1, 2, 3") == [
        ("done", 2, 2, 6)
    ]
    starts = query(workers.effects, "SELECT owner, token, count(*) FROM started GROUP BY 1, 2 ORDER BY 1")
    assert starts == [("w1", 1, 6), ("w2", 2, 6)]


# --- SIGKILL -------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_two_processes_drain_5000_jobs_exactly_once_while_one_is_sigkilled(
    workers: Workers, record_property: Callable[[str, object], None]
) -> None:
    total = 5_000
    enqueue(workers.db, total)
    options = {"concurrency": 8, "lease_ms": 1_000, "handler_seconds": 0.002, "poll_max": 0.1}
    victim = workers.start("victim", **options)
    survivor = workers.start("survivor", **options)

    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM applied") >= 500, 30, "500 effects")
    # Killed as soon as it is seen holding a lease: beside other load it was once between commits, holding none.
    held = "SELECT count(*) FROM asyncq_jobs WHERE owner = 'victim' AND status = 'leased'"
    workers.wait_until(lambda: count(workers.db, held) > 0, 30, "the victim to hold a lease")
    victim.kill()
    assert victim.wait(timeout=10) == -signal.SIGKILL
    orphaned = {row[0] for row in query(workers.db, "SELECT id FROM asyncq_jobs WHERE owner = 'victim'")}
    assert orphaned, "the victim held no lease when it was killed: nothing was left to re-claim"

    done = "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'"
    workers.wait_until(lambda: count(workers.db, done) == total, 60, f"{total} jobs done")
    code, counters = workers.stop(survivor, timeout=10)
    assert code == 0, workers.stderr()

    # "Applied exactly once": one effect row per job (the effect's primary key makes a second application
    # an increment, never a second row). A job is applied twice only if its effect committed but its finish
    # died with the victim, so every absorbed duplicate is one of the jobs the victim held at its death.
    unique, applications = query(workers.effects, "SELECT count(*), sum(count) FROM applied")[0]
    duplicated = {row[0] for row in query(workers.effects, "SELECT id FROM applied WHERE count > 1")}
    absorbed = applications - unique
    record_property("orphaned_leases", len(orphaned))
    record_property("duplicates_absorbed", absorbed)
    print(f"\nSIGKILL drain: {len(orphaned)} leases orphaned, {absorbed} duplicate application(s) absorbed")
    assert unique == total
    assert duplicated <= orphaned
    assert max(count for (count,) in query(workers.effects, "SELECT count FROM applied")) <= 2

    assert query(workers.db, "SELECT status, count(*) FROM asyncq_jobs GROUP BY 1") == [("done", total)]
    # A kill spends at most one attempt of each job whose handler had started (none if it started after the
    # victim's last commit: its attempt was still to be counted), and none of the jobs the victim had only
    # claimed ahead (its buffer): only the victim's started-and-unfinished jobs may have run a second attempt.
    # Whether the victim's buffer held a job at the instant of the kill is timing; the buffer's case is tried
    # deterministically by the next test (one attempt each, a slow handler, so the buffer is always full).
    reclaimed = {row[0] for row in query(workers.db, "SELECT id FROM asyncq_jobs WHERE attempts > 1")}
    started_by_victim = {row[0] for row in query(workers.effects, "SELECT id FROM started WHERE owner = 'victim'")}
    assert reclaimed <= orphaned & started_by_victim
    assert count(workers.db, "SELECT max(attempts) FROM asyncq_jobs") <= 2
    assert counters["stale_finishes"] == counters["leases_lost"] == 0


# --- attempts a kill may spend ----------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_kill_spends_no_attempt_of_the_jobs_a_worker_only_claimed_ahead(workers: Workers) -> None:
    """One attempt each (max_attempts 1): before the fix, every job in the victim's buffer (claimed ahead, never
    started) lost its only attempt to the kill and ended dead/exhausted without a handler ever running it. Now only
    a job in one of the victim's slots (started, or claimed for a free slot an instant before) can have spent it."""
    enqueue(workers.db, 300, max_attempts=1)
    victim = workers.start("victim", concurrency=2, lease_ms=500, handler_seconds=0.05, poll_max=0.05)
    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM applied") >= 6, 30, "6 effects")
    victim.kill()
    assert victim.wait(timeout=10) == -signal.SIGKILL
    held = dict(query(workers.db, "SELECT id, attempts FROM asyncq_jobs WHERE owner = 'victim'"))
    counted = {job_id for job_id, attempts in held.items() if attempts == 1}
    assert len(held) > 2, "the victim held no more than its running jobs: nothing was claimed ahead"
    assert len(counted) <= 2  # its two slots; the buffer's jobs had no attempt counted
    survivor = workers.start("survivor", concurrency=8, lease_ms=500, poll_max=0.05)
    live = "SELECT count(*) FROM asyncq_jobs WHERE status IN ('pending', 'leased')"
    workers.wait_until(lambda: count(workers.db, live) == 0, 60, "every job finished")
    assert workers.stop(survivor, timeout=10)[0] == 0, workers.stderr()

    dead = {row[0] for row in query(workers.db, "SELECT id FROM asyncq_jobs WHERE status = 'dead'")}
    assert dead <= counted
    assert count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'") == 300 - len(dead)


@pytest.mark.timeout(90)
def test_a_job_that_kills_its_worker_every_time_still_ends_dead_after_its_attempts(workers: Workers) -> None:
    asyncio.run(_enqueue_poison(workers.db))  # the oldest job: each restarted worker starts it in a free slot
    enqueue(workers.db, 5)
    status = "SELECT status FROM asyncq_jobs WHERE id = 'poison'"
    for restart in range(8):
        worker = workers.start(f"w{restart}", concurrency=4, lease_ms=300, poll_max=0.05)
        eventually_sync(
            lambda worker=worker: worker.poll() is not None or query(workers.db, status) == [("dead",)],
            "the worker killed by the poison job, or the job dead",
            timeout=30,
            details=workers.stderr,
        )
        workers.procs.remove(worker)
        if worker.returncode is None:  # the poison pill was swept dead: this worker lives on
            worker.kill()
            worker.wait(timeout=10)
            break
        assert worker.returncode == -signal.SIGKILL  # the poison pill killed it
    poison = query(workers.db, "SELECT status, reason, attempts FROM asyncq_jobs WHERE id = 'poison'")
    assert poison == [("dead", "exhausted", 3)]
    assert count(workers.effects, "SELECT count(*) FROM started WHERE id = 'poison'") == 3


async def _enqueue_poison(db: Path) -> None:
    async with await Queue.open(db) as queue:
        await queue.enqueue("poison", {"poison": True}, max_attempts=3, ttl=600)


# --- pause from another process ------------------------------------------------------------------------


def test_a_pause_from_another_process_stops_the_pools_claims_and_resume_restarts_them(workers: Workers) -> None:
    enqueue(workers.db, 60)
    worker = workers.start("w1", concurrency=2, handler_seconds=0.05, grace=5, lease_ms=5_000, poll_max=0.05)
    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM started") >= 4, 15, "the pool working")

    async def move(paused: bool) -> None:
        async with await Queue.open(workers.db) as queue:  # this test's process, not the pool's
            if paused:
                await queue.pause("default", note="provider outage", by="test")
            else:
                await queue.resume("default", note="provider back", by="test")

    asyncio.run(move(True))
    # Everything the pool holds now was claimed before the pause: in flight, or claimed ahead into its buffer.
    held = {job_id for (job_id,) in query(workers.db, "SELECT id FROM asyncq_jobs WHERE status = 'leased'")}
    ended = {job_id for (job_id,) in query(workers.db, "SELECT id FROM asyncq_jobs WHERE status = 'done'")}
    # The pool finishes what it holds (each finish is a group commit that also claims for the freed slot) ...
    workers.wait_until(
        lambda: count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'leased'") == 0,
        15,
        "the jobs held at the pause finished",
    )
    # ... and those claims found nothing: no job beyond those it held has started, or left pending.
    started = {job_id for (job_id,) in query(workers.effects, "SELECT DISTINCT id FROM started")}
    assert started <= held | ended, started - held - ended
    done = count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'")
    assert done == len(held | ended) < 60
    assert count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'pending'") == 60 - done
    asyncio.run(move(False))
    workers.wait_until(
        lambda: count(workers.db, "SELECT count(*) FROM asyncq_jobs WHERE status = 'done'") == 60,
        20,
        "every job done after the resume",
    )
    code, counters = workers.stop(worker, timeout=10)
    assert code == 0 and counters["finished"] == {"done": 60}, workers.stderr()
    moves = query(workers.db, "SELECT action, actor, note FROM asyncq_queue_audit ORDER BY seq")
    assert moves == [("pause", "test", "provider outage"), ("resume", "test", "provider back")]


def test_a_pause_from_another_process_stops_a_pool_on_postgresql(workers: Workers, postgres_url: str) -> None:
    async def read(what: str) -> Any:
        async with await Queue.open(postgres_url) as queue:
            if what == "fill":
                await queue.enqueue_many(JobSpec(f"job-{i:02d}", {"i": i}) for i in range(40))
                return None
            if what in ("pause", "resume"):
                move = queue.pause if what == "pause" else queue.resume
                return await move("default", note=f"{what} from the test", by="test")
            return {job.id: job.status for job in await queue.list_jobs(limit=100, body=False)}

    def statuses() -> dict[str, str]:
        found: dict[str, str] = asyncio.run(read("statuses"))
        return found

    asyncio.run(read("fill"))
    workers.db = postgres_url  # type: ignore[assignment]  (the worker opens a URL as it opens a path)
    worker = workers.start("w1", concurrency=2, handler_seconds=0.05, grace=5, lease_ms=5_000, poll_max=0.05)
    workers.wait_until(lambda: count(workers.effects, "SELECT count(*) FROM started") >= 4, 15, "the pool working")
    asyncio.run(read("pause"))
    # A claim whose statement began before the pause committed may still land (docs/flow-control.md); after it,
    # the pool finishes what it holds, and the claims of those finishing commits find nothing.
    workers.wait_until(lambda: "leased" not in statuses().values(), 15, "the jobs held at the pause finished")
    started = {job_id for (job_id,) in query(workers.effects, "SELECT DISTINCT id FROM started")}
    after = statuses()
    done = {job_id for job_id, status in after.items() if status == "done"}
    assert started == done and len(done) < 40 and set(after.values()) == {"done", "pending"}
    asyncio.run(read("resume"))
    workers.wait_until(lambda: set(statuses().values()) == {"done"}, 20, "every job done after the resume")
    code, counters = workers.stop(worker, timeout=10)
    assert code == 0 and counters["finished"] == {"done": 40}, workers.stderr()


# --- an idle pool's offer (core.offers) ---------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def offer_store(request: pytest.FixtureRequest, workers: Workers) -> tuple[str, str]:
    """The store the offer test runs on (a file, or a fresh PostgreSQL schema), and its jobs table's name."""
    if request.param == "sqlite":
        return str(workers.db), "asyncq_jobs"
    return request.getfixturevalue("postgres_url"), "jobs"


async def _enqueue_and_read_row(target: str, table: str, job_id: str) -> tuple[Any, ...]:
    """Enqueue ``job_id`` from this process, and read its row inside the enqueue's own transaction, before the
    commit: what the enqueue itself made of it."""
    mark = "?" if table == "asyncq_jobs" else "$1"
    async with await Queue.open(target) as queue, queue.transaction() as tx:
        await tx.enqueue(job_id, {"id": job_id})
        [row] = await tx.execute(f"SELECT status, owner, attempts, token FROM {table} WHERE id = {mark}", [job_id])
        return tuple(row)


async def _all_done(target: str, ids: list[str]) -> bool:
    async with await Queue.open(target) as queue:
        return all(job is not None and job.status == "done" for job in [await queue.get(job_id) for job_id in ids])


@pytest.mark.timeout(90)
def test_another_process_enqueues_into_an_idle_pools_offer_and_a_killed_pools_offered_job_runs_after_its_lease(
    workers: Workers, offer_store: tuple[str, str]
) -> None:
    """An idle pool in another process leaves an offer: an enqueue here leases its job to that pool in its own
    transaction (uncounted), and the pool runs it once. SIGKILLed with its offer out, the pool strands the next job
    offered to it only until that job's lease ends: another pool runs it then, once, its attempt not spent."""
    target, table = offer_store
    workers.db = target  # type: ignore[assignment]  (the worker opens a URL as it opens a path)
    idle = workers.start("idle", concurrency=2, lease_ms=1_500, poll_max=0.05)
    enqueued: list[str] = []

    def enqueue_one(job_id: str) -> tuple[Any, ...]:
        enqueued.append(job_id)
        return asyncio.run(_enqueue_and_read_row(target, table, job_id))

    def ran(*ids: str) -> bool:
        marks = ", ".join("?" * len(ids))
        return count(workers.effects, f"SELECT count(*) FROM applied WHERE id IN ({marks})", ids) == len(ids)

    # the pool is up and idle once an enqueue finds its offer (a probe enqueued before runs as any job)
    workers.wait_until(lambda: enqueue_one(f"probe-{len(enqueued)}") == ("leased", "idle", 0, 1), 20, "an offer")
    assert enqueue_one("a") == ("leased", "idle", 0, 1)  # the offer stays out while the pool has free slots
    workers.wait_until(lambda: ran(*enqueued) and asyncio.run(_all_done(target, enqueued)), 20, "every job done")
    assert query(workers.effects, "SELECT token, owner FROM started WHERE id = 'a'") == [(1, "idle")]

    idle.kill()
    assert idle.wait(timeout=10) == -signal.SIGKILL
    assert enqueue_one("b") == ("leased", "idle", 0, 1)  # its offer is still out
    survivor = workers.start("survivor", concurrency=2, lease_ms=1_500, poll_max=0.05)
    workers.wait_until(lambda: ran("b"), 30, "job b run after its lease")
    assert query(workers.effects, "SELECT token, owner FROM started WHERE id = 'b'") == [(2, "survivor")]
    assert query(workers.effects, "SELECT count FROM applied WHERE id = 'b'") == [(1,)]
    code, counters = workers.stop(survivor, timeout=10)
    assert code == 0 and counters["finished"] == {"done": 1}, workers.stderr()
