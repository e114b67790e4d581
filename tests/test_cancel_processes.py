"""Cancelling a running job held by a worker in another process (``tests/pool_children.py``), on every driver.

The worker's handler records its start in an effects file of its own and then works for a minute; only a handler
that ran to its end records ``applied``. The test process calls ``Queue.cancel`` and waits, by polling the store
under a deadline, for the job to end dead (``cancelled``): within one lease renewal while the worker runs, or once
its lease expires while the worker is stopped with SIGSTOP (and then the job is not run again).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from drivers import DRIVERS, Driver
from waiting import eventually

from asyncq.queue import Queue

try:
    import pool_children
except ImportError:  # tests/ imported as a package
    from tests import pool_children

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(pool_children.__file__).resolve()
LEASE_S = 2.0  # renewed when half of it is left, looked at every quarter: a request is seen within 1.5 s


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
async def target(driver: Driver, tmp_path: Path) -> AsyncIterator[str]:
    async with driver.target(tmp_path, "queue") as where:
        async with await Queue.open(where):  # created and migrated before the worker opens it
            pass
        yield where


class Worker:
    """One worker process serving ``target`` with a minute-long handler; killed by pid at teardown."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        self.effects = tmp_path / "effects.db"
        # Made (WAL, tables) before the worker starts: a worker and this test's first read both switching a new
        # file to WAL at once fail with "database is locked" without waiting (make test beside two busy loops).
        pool_children.open_effects(self.effects).close()
        self.stderr_path = tmp_path / "worker.stderr"
        argv = [sys.executable, str(SCRIPT), "worker", "--db", target, "--effects", str(self.effects)]
        argv += ["--owner", "w1", "--concurrency", "2", "--lease-ms", str(int(LEASE_S * 1000))]
        argv += ["--handler-seconds", "60", "--grace", "1", "--poll-max", "0.05"]
        with open(self.stderr_path, "wb") as errors:
            self.proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=errors)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def dead(self) -> str | None:
        return None if self.proc.poll() is None else f"worker exited {self.proc.returncode}\n{self.stderr()}"

    def starts(self, job_id: str) -> int:
        con = pool_children.open_effects(self.effects)
        try:
            return int(con.execute("SELECT count(*) FROM started WHERE id = ?", (job_id,)).fetchone()[0])
        finally:
            con.close()

    def applied(self, job_id: str) -> int:
        con = pool_children.open_effects(self.effects)
        try:
            return int(con.execute("SELECT count(*) FROM applied WHERE id = ?", (job_id,)).fetchone()[0])
        finally:
            con.close()

    def stop(self) -> dict[str, object]:
        """SIGTERM; the counters it printed."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, self.stderr()
        counters: dict[str, object] = json.loads(out)
        return counters

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[[str], Worker]]:
    started: list[Worker] = []

    def start(target: str) -> Worker:
        worker = Worker(tmp_path, target)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGCONT)
        worker.kill()


async def status_of(queue: Queue, job_id: str) -> tuple[str, str | None]:
    job = await queue.get(job_id)
    assert job is not None
    return job.status, job.reason


async def test_a_running_job_in_another_process_is_cancelled_within_one_renewal(
    target: str, start_worker: Callable[[str], Worker]
) -> None:
    worker = start_worker(target)
    async with await Queue.open(target) as queue:
        await queue.enqueue("long", {"n": 1})
        await eventually(lambda: worker.starts("long"), "the worker starts the job", stop=worker.dead)
        asked = time.monotonic()
        outcome = await queue.cancel("long", note="customer left")
        assert (outcome.state, outcome.status) == ("requested", "leased")
        await eventually(
            lambda: _is(queue, "long", ("dead", "cancelled")),
            "the job ends dead, cancelled",
            timeout=LEASE_S * 3,
            stop=worker.dead,
        )
        took = time.monotonic() - asked
        assert took < LEASE_S, f"seen {took:.2f} s after the cancel: more than one renewal"
        job = await queue.get("long")
        assert job is not None and job.attempts == 1 and job.cancel_requested_at is not None
        assert [entry.action for entry in await queue.history("long")] == ["cancel_request"]
        assert (await queue.cancel("long", note="again")).state == "too_late"
    counters = worker.stop()
    assert worker.applied("long") == 0  # its handler was cancelled before its work ended
    assert (counters["cancels_requested"], counters["cancelled"]) == (1, 1), counters
    assert counters["finished"] == {"dead": 1} and counters["leases_lost"] == 0, counters


async def test_a_cancel_while_the_worker_is_stopped_lands_when_its_lease_expires(
    target: str, start_worker: Callable[[str], Worker]
) -> None:
    worker = start_worker(target)
    async with await Queue.open(target) as queue:
        await queue.enqueue("long", {"n": 1})
        await eventually(lambda: worker.starts("long"), "the worker starts the job", stop=worker.dead)
        await stop_outside_a_write(worker.proc, target)
        try:
            outcome = await queue.cancel("long", note="customer left")
            assert outcome.state == "requested"  # its lease is still live
            job = await queue.get("long")
            assert job is not None and job.lease_until is not None

            async def swept() -> bool:
                tickets = await queue.claim("w2", lease=LEASE_S)  # a claim sweeps first
                assert tickets == [], f"the cancelled job was claimed again: {tickets}"
                return await _is(queue, "long", ("dead", "cancelled"))

            await eventually(swept, "the sweep ends the job once its lease expires", timeout=LEASE_S * 4)
            assert queue.now() >= job.lease_until
        finally:
            worker.proc.send_signal(signal.SIGCONT)
        # the stopped holder wakes up: its renewal is refused, its result dropped; the job stays cancelled
        counters = worker.stop()
        assert await status_of(queue, "long") == ("dead", "cancelled")
    assert worker.starts("long") == 1 and worker.applied("long") == 0  # never run again
    assert counters["leases_lost"] == 1 and counters["finished"] == {}, counters


async def stop_outside_a_write(proc: subprocess.Popen[bytes], target: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write open on ``target`` (SQLite: the file's write lock; PostgreSQL:
    an open transaction), else this test's own cancel would wait for a frozen process: a worker renews and commits
    every few ms, so a stop lands inside a write now and then. Caught inside one, it is resumed and tried again."""
    for _ in range(200):
        proc.send_signal(signal.SIGSTOP)
        await eventually(lambda: _state(proc.pid) == "T", "the worker stopped")
        if not await _writing(target):
            return
        proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(0)
    raise AssertionError("the worker was inside a write at every stop")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _writing(target: str) -> bool:
    if "://" not in target:  # SQLite: the write lock, tried without waiting
        con = sqlite3.connect(target, timeout=0, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            con.close()
    import asyncpg

    from asyncq.store.postgres.connection import parse_url

    conn = await asyncpg.connect(parse_url(target).dsn, timeout=5)
    try:
        open_transactions: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
        )
        return open_transactions > 0
    finally:
        await conn.close()


async def _is(queue: Queue, job_id: str, wanted: tuple[str, str | None]) -> bool:
    return await status_of(queue, job_id) == wanted
