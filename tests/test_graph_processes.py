"""Dependencies and groups worked by three real worker processes (``tests/graph_children.py``) that are SIGKILLed and
replaced while the members and the dependencies run, on a SQLite file and on PostgreSQL (docs/dependencies.md).

Each handler records its start in an effects file, with whether what the job waits for had ended then (its
dependencies done; for the group's callback: the group complete, every member ended, the outcome in its body the
stored one). The guarantees read there: no job starts early; the group's callback and every dependant run once,
a second start only ever after the worker holding the first was killed (its lease then expired); the group's
counters and every dependant end as the members and dependencies did."""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import eventually_sync

from asyncq.core.groups import GroupOutcome, group_callback_id
from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

try:
    import graph_children
except ImportError:  # tests/ imported as a package
    from tests import graph_children

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(graph_children.__file__).resolve()
MEMBERS = 48  # every 8th fails (permanent): 42 done, 6 dead
CHAINS = 6  # a_i, b_i; c_i after both; d_i after c_i. a_0 fails: c_0 and d_0 end dead (dependency), never run
KILLS = 5
CALLBACK = group_callback_id("import")


async def enqueue_graph(target: str) -> None:
    async with await Queue.open(target) as queue:
        async with queue.transaction() as tx:
            for n in range(MEMBERS):
                await tx.enqueue(f"m{n:03d}", {"ms": 20 + n % 5 * 20, "fail": n % 8 == 0}, group="import")
            await tx.seal_group("import", callback=JobSpec(CALLBACK, {"ms": 5}))
        for i in range(CHAINS):
            a, b, c = f"a{i}", f"b{i}", f"c{i}"
            await queue.enqueue_many(
                [
                    JobSpec(a, {"ms": 60, "fail": i == 0}),
                    JobSpec(b, {"ms": 30}),
                    JobSpec(c, {"needs": [a, b]}, after=[a, b]),
                    JobSpec(f"d{i}", {"needs": [c]}, after=[c]),
                ]
            )


async def read_state(target: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    async with await Queue.open(target) as queue:
        jobs = {job.id: job for job in await queue.list_jobs(limit=1000, body=False)}
        waits = await queue.waiting_for([f"{x}{i}" for x in "cd" for i in range(CHAINS)])
        return jobs, await queue.group("import"), waits


class Workers:
    """Worker processes on one store; kills by pid only the ones it started, and remembers whom it killed."""

    def __init__(self, target: str, tmp_path: Path) -> None:
        self.target = target
        self.tmp_path = tmp_path
        self.effects = tmp_path / "effects.db"
        graph_children.open_effects(self.effects).close()
        self.live: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.started = 0

    def start(self) -> None:
        owner = f"w{self.started}"
        self.started += 1
        argv = [sys.executable, str(SCRIPT), "--store", self.target, "--effects", str(self.effects), "--owner", owner]
        with open(self.tmp_path / f"{owner}.stderr", "wb") as errors:
            self.live[owner] = subprocess.Popen(argv, cwd=self.tmp_path, stderr=errors)

    def kill_one(self) -> None:
        owner = random.choice(sorted(self.live))
        proc = self.live.pop(owner)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        self.killed.add(owner)

    def starts(self) -> list[tuple[str, int, str, int]]:
        con = sqlite3.connect(self.effects, timeout=30)
        try:
            return con.execute("SELECT id, token, owner, early FROM started ORDER BY seq").fetchall()
        finally:
            con.close()

    def stderr(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(self.tmp_path.glob("*.stderr"))
        )

    def dead(self) -> str | None:
        for owner, proc in self.live.items():
            if proc.poll() is not None:
                return f"worker {owner} exited {proc.returncode}"
        return None

    def stop_all(self) -> None:
        for proc in self.live.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.live.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def make_workers(tmp_path: Path) -> Iterator[list[Workers]]:
    made: list[Workers] = []
    yield made
    for workers in made:
        for proc in workers.live.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def run_with_kills(target: str, tmp_path: Path, made: list[Workers]) -> None:
    asyncio.run(enqueue_graph(target))
    workers = Workers(target, tmp_path)
    made.append(workers)
    for _ in range(3):
        workers.start()
    for kill in range(KILLS):  # a kill after every few starts, while members and dependencies run
        seen = 6 * (kill + 1)
        eventually_sync(lambda n=seen: len(workers.starts()) >= n, f"{seen} starts", timeout=30,  # type: ignore[misc]
                        stop=workers.dead, details=workers.stderr)  # fmt: skip
        workers.kill_one()
        workers.start()

    def finished() -> bool:
        jobs, group, _waits = asyncio.run(read_state(target))
        return group.complete and all(job.status in ("done", "dead") for job in jobs.values())

    eventually_sync(finished, "every job ended", timeout=60, interval=0.1, stop=workers.dead, details=workers.stderr)
    workers.stop_all()
    check(workers, *asyncio.run(read_state(target)))


def check(workers: Workers, jobs: dict[str, Any], group: Any, waits: dict[str, Any]) -> None:
    starts = workers.starts()
    assert [row for row in starts if row[3]] == [], "a job started before what it waits for had ended"
    by_job: dict[str, list[tuple[int, str]]] = {}
    for job_id, token, owner, _early in starts:
        by_job.setdefault(job_id, []).append((token, owner))
    for job_id, runs in by_job.items():  # a second start only after the holder of the first was killed
        assert all(owner in workers.killed for _token, owner in runs[:-1]), (job_id, runs, workers.killed)
        assert len({token for token, _owner in runs}) == len(runs), (job_id, runs)  # each start a new claim
    assert any(len(runs) > 1 for runs in by_job.values()), "no kill hit a job in flight"
    assert group.outcome == GroupOutcome("import", MEMBERS, MEMBERS - MEMBERS // 8, MEMBERS // 8)
    assert jobs[CALLBACK].status == "done" and len(by_job[CALLBACK]) >= 1
    for i in range(CHAINS):
        c, d = jobs[f"c{i}"], jobs[f"d{i}"]
        if i == 0:
            assert [(j.status, j.reason) for j in (c, d)] == [("dead", "dependency")] * 2
            assert "c0" not in by_job and "d0" not in by_job
        else:
            assert (c.status, c.waits, d.status, d.waits) == ("done", 0, "done", 0)
            assert {each.state for each in waits[f"c{i}"].dependencies} == {"met"}


def test_three_killed_workers_on_sqlite_release_each_dependant_and_the_callback_once(
    tmp_path: Path, make_workers: list[Workers]
) -> None:
    run_with_kills(str(tmp_path / "queue.db"), tmp_path, make_workers)


def test_three_killed_workers_on_postgresql_release_each_dependant_and_the_callback_once(
    tmp_path: Path, make_workers: list[Workers], postgres_url: str
) -> None:
    run_with_kills(postgres_url, tmp_path, make_workers)
