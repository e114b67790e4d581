"""Schedules evaluated by real worker processes (``tests/schedule_children.py``) on a SQLite file and on PostgreSQL:
three workers whose clocks are offset (one moved forward while it runs) fire every tick of the grid once, as a job
or an event, never twice and never losing one; under ``overlap="skip"`` a handler slower than the interval never
runs twice at once; a process killed inside a tick's transaction leaves nothing, and the next evaluation makes the
tick's job once."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import eventually_sync

from asyncq.core.schedules import Schedule, ScheduleEvent, ScheduleSpec, schedule_job_id
from asyncq.queue import Queue

try:
    import schedule_children
except ImportError:  # tests/ imported as a package
    from tests import schedule_children

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(schedule_children.__file__).resolve()
EVERY_MS = 200


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "queue.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:  # only the ones this test started, by their own handle
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(procs: list[subprocess.Popen[str]], tmp_path: Path, *argv: str) -> subprocess.Popen[str]:
    errors = open(tmp_path / f"child{len(procs)}.stderr", "w")  # noqa: SIM115 (closed below; the child keeps it)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *argv], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=errors, text=True)  # fmt: skip
    errors.close()
    procs.append(proc)
    return proc


def stderr_of(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(tmp_path.glob("*.stderr")))


async def stored(target: str) -> tuple[Schedule, list[ScheduleEvent], list[str]]:
    async with await Queue.open(target, read_only=True) as queue:
        [schedule] = await queue.schedules()
        events = await queue.schedule_events(limit=1000, skipped_only=True)
        jobs = [job.id for job in await queue.list_jobs(limit=1001, body=False)]
    assert len(events) < 1000 and len(jobs) <= 1000
    return schedule, events, jobs


def progress(target: str) -> int:
    """How many ticks the schedule has decided (0 before the first worker declared it)."""

    async def read() -> int:
        async with await Queue.open(target) as queue:
            found = await queue.schedules()
        return 0 if not found or found[0].last_tick is None else (found[0].last_tick - found[0].declared_at) // EVERY_MS

    return asyncio.run(read())


async def touch(target: str) -> None:
    async with await Queue.open(target):
        pass


def run_workers(target: str, tmp_path: Path, procs: list[subprocess.Popen[str]], *options: str, ticks: int) -> None:
    """Three workers on clocks offset by 0, +0.7 s and -0.5 s (this one moved +3 s after a second), until the
    schedule has decided ``ticks`` ticks; then each is stopped (SIGTERM, jobs in flight finish)."""
    asyncio.run(touch(target))  # created and migrated before the race
    base = ["--store", target, "--log", str(tmp_path / "runs.log"), "--every", str(EVERY_MS / 1000), *options]
    clocks = [["--offset-ms", "0"], ["--offset-ms", "700"], ["--offset-ms", "-500", "--jump-after", "1", "--jump-ms",
                                                             "3000"]]  # fmt: skip
    workers = [start(procs, tmp_path, *base, *clock) for clock in clocks]
    for proc in workers:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", stderr_of(tmp_path)

    def exited() -> str | None:
        return next((f"a worker exited {p.returncode}" for p in workers if p.poll() is not None), None)

    eventually_sync(lambda: progress(target) >= ticks, f"{ticks} ticks decided", timeout=60, stop=exited,
                    details=lambda: stderr_of(tmp_path))  # fmt: skip
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(timeout=30) == 0, stderr_of(tmp_path)


def check_every_tick_once(schedule: Schedule, events: list[ScheduleEvent], jobs: list[str]) -> set[str]:
    """Every tick of the grid up to the last one decided is exactly one job or one event's tick; no job is off it.
    The jobs of the grid."""
    assert schedule.last_tick is not None
    grid = [
        schedule.declared_at + n * EVERY_MS
        for n in range(1, (schedule.last_tick - schedule.declared_at) // EVERY_MS + 1)
    ]
    covered: list[int] = []
    for event in events:
        through = event.tick_ms if event.through_ms is None else event.through_ms
        assert event.tick_ms is not None
        covered += range(event.tick_ms, through + 1, EVERY_MS)
        assert event.ticks == (through - event.tick_ms) // EVERY_MS + 1
    fired = [tick for tick in grid if schedule_job_id("beat", tick) in jobs]
    assert sorted(fired + covered) == grid  # each tick once: run, or skipped/missed
    assert len(fired) == schedule.ticks_fired and len(covered) == schedule.ticks_skipped + schedule.ticks_missed
    assert {job for job in jobs if not job.startswith("sch-beat-now")} == {schedule_job_id("beat", t) for t in fired}
    return {schedule_job_id("beat", tick) for tick in fired}


def runs(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "runs.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_three_workers_on_offset_and_moved_clocks_fire_each_tick_once(
    target: str, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    run_workers(target, tmp_path, children, "--overlap", "allow", ticks=40)
    schedule, events, jobs = asyncio.run(stored(target))
    fired = check_every_tick_once(schedule, events, jobs)
    ran = [run["job"] for run in runs(tmp_path)]
    assert len(ran) == len(set(ran)) and set(ran) <= fired  # no job ran twice
    assert len(fired) >= 20 and {run["pid"] for run in runs(tmp_path)} <= {p.pid for p in children}
    assert any(event.kind == "missed" for event in events)  # the moved clock found ticks due at once


def test_overlap_skip_never_runs_a_slow_handler_twice_at_once_across_three_workers(
    target: str, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    run_workers(target, tmp_path, children, "--overlap", "skip", "--work", "0.5", ticks=30)
    schedule, events, jobs = asyncio.run(stored(target))
    check_every_tick_once(schedule, events, jobs)
    done = sorted(runs(tmp_path), key=lambda run: run["start"])
    assert len(done) >= 3
    for earlier, later in itertools.pairwise(done):
        assert later["start"] >= earlier["end"], (earlier, later)  # never two runs at once
    assert sum(event.kind == "overlap" for event in events) >= 5


def test_a_worker_killed_inside_a_ticks_transaction_loses_and_doubles_nothing(
    target: str, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    started = time.time_ns() // 1_000_000 - 60_000

    async def declare() -> None:
        async with await Queue.open(target, clock=lambda: started) as queue:
            await queue.declare_schedules([ScheduleSpec("beat", {}, every=10)])

    asyncio.run(declare())  # six ticks are due at once for any process now
    before = asyncio.run(stored(target))
    holder = start(children, tmp_path, "--store", target, "--hold")
    assert holder.stdout is not None and holder.stdout.readline().startswith("in-tick"), stderr_of(tmp_path)
    assert asyncio.run(stored(target)) == before  # nothing committed while it holds the transaction
    holder.kill()
    holder.wait()
    assert asyncio.run(stored(target)) == before  # nothing after the kill either

    async def evaluate_twice() -> tuple[tuple[str, ...], tuple[str, ...]]:
        async with await Queue.open(target) as queue:
            return (await queue.run_schedules()).jobs, (await queue.run_schedules()).jobs

    first, second = asyncio.run(evaluate_twice())
    schedule, events, jobs = asyncio.run(stored(target))
    assert len(first) == 1 and second == () and jobs == list(first)
    assert schedule.ticks_fired == 1 and schedule.ticks_missed == len(events) >= 5
    assert first[0] == schedule_job_id("beat", schedule.last_tick or 0)
