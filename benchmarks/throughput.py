"""End-to-end throughput: enqueue → claim → no-op handler → finish, asyncq's pool beside its peers.

Every side runs the same two phases on a fresh file: enqueue ``jobs`` jobs, then drain them all through a
handler that does nothing, and its jobs/s is ``jobs / (enqueue time + drain time)``.

- asyncq: ``Queue.enqueue_many`` in batches of 500 (the product's bulk path), then ``Pool(queue,
  concurrency=N).run(burst=True)`` for N = 1, 4, 16, 64 tasks, in each durability mode (``full`` = WAL+FULL,
  ``full-delete`` = DELETE+EXTRA, ``normal`` = WAL+NORMAL). The handler awaits ``asyncio.sleep(0)`` and counts
  the handlers running at once: the peak shows every task slot busy.
- the floor: a plain ``sqlite3`` loop running asyncq's own INSERT, CLAIM (``UPDATE … RETURNING``) and finish
  statements, one job per ``BEGIN IMMEDIATE`` transaction each (three commits per job), in WAL+FULL.
- huey ``SqliteHuey(journal_mode='wal', fsync=True)``: ``task()`` calls, then an in-process loop of
  ``dequeue()`` + ``execute()`` (not the multi-process consumer).
- litequeue, forced to ``PRAGMA synchronous=FULL`` on its connection: ``put`` in batches of 500 inside its
  ``transaction()``, then ``pop`` + ``done``.
- persist-queue ``SQLiteAckQueue`` (WAL + SQLite's default FULL): ``put``, then ``get`` + ``ack``, with one
  consumer thread and with four (``multithreading=True``).

Each side reports the journal mode and synchronous level read back with PRAGMA from the connection it used.
Sides alternate run by run (rotating the order), so drift in the disk's speed falls on all alike; the table
holds medians, and the ratios come from the same invocation.

Run ``.venv/bin/python benchmarks/throughput.py`` (1-4 minutes, by how busy the disk is; rewrites the
``throughput`` section of docs/benchmarks.md; the peers need ``.venv/bin/pip install -e '.[peers]'`` and are
skipped if missing), or add ``--quick`` for a smoke run (200 jobs, 2 runs, < 20 s, writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import _report

from asyncq.core.jobs import DEFAULT_QUEUE, JobSpec
from asyncq.queue import Queue
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.migrations import migrate_in_transaction
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.statements import FinishChange, FinishRow, finish_params, finish_rows, insert_rows, sql
from asyncq.worker.pool import JobContext, Pool

COMMAND = ".venv/bin/python benchmarks/throughput.py"
SECTION = "throughput"
BATCH = 500  # jobs per enqueue_many call (asyncq) and per put transaction (litequeue)
TASK_COUNTS = (1, 4, 16, 64)
MODES = ("full", "full-delete", "normal")
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
PEERS = {"huey": "huey", "litequeue": "litequeue", "persist-queue": "persistqueue"}  # distribution: module
POOL, FLOOR, PQ = "asyncq Pool", "stdlib floor", "persist-queue SQLiteAckQueue"


@dataclass(frozen=True)
class Settings:
    jobs: int
    runs: int


FULL_RUN = Settings(jobs=1_500, runs=7)
QUICK_RUN = Settings(jobs=200, runs=2)


@dataclass(frozen=True)
class Sample:
    """One run of one side: the two phases' times, the settings read back, and the pool's evidence."""

    enqueue_s: float
    drain_s: float
    pragmas: str  # "journal/synchronous" as read back from the side's connection(s)
    peak: int  # handlers (asyncq) or consumer threads (peers) running at once
    commits: int = 0  # the pool's drain commits (asyncq only)


@dataclass(frozen=True)
class Side:
    name: str
    mode: str  # the durability asked for
    tasks: int
    producer: str  # the enqueue path used
    run: Callable[[Path, int], Sample]
    samples: list[Sample] = field(default_factory=list)

    def median(self, phase: Callable[[Sample], float]) -> float:
        return statistics.median(phase(sample) for sample in self.samples)


def end_to_end(jobs: int) -> Callable[[Sample], float]:
    return lambda sample: jobs / (sample.enqueue_s + sample.drain_s)


def pragma_label(journal: str, synchronous: int) -> str:
    return f"{journal.upper()}/{SYNC_NAMES.get(synchronous, str(synchronous))}"


def read_pragmas(con: sqlite3.Connection) -> str:
    """The journal mode and synchronous level ``con`` is really using."""
    return pragma_label(
        con.execute("PRAGMA journal_mode").fetchone()[0], con.execute("PRAGMA synchronous").fetchone()[0]
    )


def check_drained(name: str, handled: int, jobs: int) -> None:
    if handled != jobs:
        raise RuntimeError(f"{name}: handled {handled} of {jobs} jobs")


# -- asyncq ------------------------------------------------------------------------------------------


class Gauge:
    """The no-op handler, counting how many run at once."""

    def __init__(self) -> None:
        self.running = self.peak = self.handled = 0

    async def handle(self, body: Any, context: JobContext) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0)
        self.running -= 1
        self.handled += 1


async def queue_pragmas(queue: Queue) -> str:
    async with queue.transaction() as tx:
        journal = (await tx.execute("PRAGMA journal_mode"))[0][0]
        synchronous = (await tx.execute("PRAGMA synchronous"))[0][0]
    return pragma_label(journal, synchronous)


async def asyncq_cycle(path: Path, jobs: int, mode: str, tasks: int) -> Sample:
    queue = await Queue.open(str(path / "asyncq.db"), durability=mode)
    try:
        pragmas = await queue_pragmas(queue)
        start = time.perf_counter()
        for first in range(0, jobs, BATCH):
            await queue.enqueue_many([JobSpec(f"job-{n}", {"n": n}) for n in range(first, min(first + BATCH, jobs))])
        enqueued = time.perf_counter()
        pool, gauge = Pool(queue, concurrency=tasks), Gauge()
        pool.register(DEFAULT_QUEUE, gauge.handle)
        await pool.run(burst=True)
        drained = time.perf_counter()
    finally:
        await queue.close()
    check_drained("asyncq", pool.counters.finished.get("done", 0), jobs)
    return Sample(enqueued - start, drained - enqueued, pragmas, gauge.peak, pool.counters.commits)


def asyncq_run(path: Path, jobs: int, mode: str, tasks: int) -> Sample:
    return asyncio.run(asyncq_cycle(path, jobs, mode, tasks))


# -- the stdlib floor: asyncq's statements, one job per transaction ---------------------------------


def floor_open(file: Path) -> sqlite3.Connection:
    con = sqlite3.connect(file, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    with write_transaction(con):
        migrate_in_transaction(con)  # the product's tables at their current version, as Queue.open makes them
    return con


def floor_transaction(con: sqlite3.Connection, statement: str, params: dict[str, Any] | Sequence[Any]) -> list[Any]:
    con.execute("BEGIN IMMEDIATE")
    rows = con.execute(statement, params).fetchall()
    con.execute("COMMIT")
    return rows


def floor_drain(con: sqlite3.Connection) -> int:
    claim, finish, handled = sql(PRODUCT, PRODUCT.claim), finish_rows(PRODUCT, 1), 0
    while True:
        now = time.time_ns() // 1_000_000
        params = {"now": now, "owner": "floor", "lease_ms": 30_000, "limit": 1, "count": 1, "queue": DEFAULT_QUEUE}
        rows = floor_transaction(con, claim, params)
        if not rows:
            return handled
        seq, job_id, _body, _priority, token, attempts, deadline, max_attempts = rows[0][:8]  # Ticket.from_row's
        row = FinishRow(seq, job_id, token, attempts, min(now + 30_000, deadline), max_attempts, deadline)
        done = finish_params(FinishChange("done", None, now, 0, "floor"), [row])
        if not floor_transaction(con, finish, done):
            raise RuntimeError(f"the floor's finish of seq {seq} did not land")
        handled += 1


def floor_run(path: Path, jobs: int) -> Sample:
    con = floor_open(path / "floor.db")
    try:
        insert, start = insert_rows(PRODUCT, 1), time.perf_counter()
        for n in range(jobs):
            now = time.time_ns() // 1_000_000
            # priority 0; no unique key, group, limit key or task
            row = (f"job-{n}", DEFAULT_QUEUE, f'{{"n":{n}}}', 0, None, None, None, None, 3, now, now + 86_400_000)
            floor_transaction(con, insert, row)
        enqueued = time.perf_counter()
        check_drained(FLOOR, floor_drain(con), jobs)
        drained = time.perf_counter()
        return Sample(enqueued - start, drained - enqueued, read_pragmas(con), 1)
    finally:
        con.close()


# -- peers (imported lazily: they are an optional dependency group) ---------------------------------


def huey_run(path: Path, jobs: int) -> Sample:
    from huey import SqliteHuey  # type: ignore[import-untyped]

    huey = SqliteHuey("bench", filename=str(path / "huey.db"), journal_mode="wal", fsync=True)
    noop = huey.task()(lambda n: None)
    start = time.perf_counter()
    for n in range(jobs):
        noop(n)
    enqueued, handled = time.perf_counter(), 0
    while (task := huey.dequeue()) is not None:
        huey.execute(task)
        handled += 1
    drained = time.perf_counter()
    pragmas = read_pragmas(huey.storage.conn)
    huey.storage.close()
    check_drained("huey", handled, jobs)
    return Sample(enqueued - start, drained - enqueued, pragmas, 1)


def litequeue_run(path: Path, jobs: int) -> Sample:
    from litequeue import LiteQueue  # type: ignore[import-untyped]

    queue = LiteQueue(str(path / "litequeue.db"))
    queue.conn.execute("PRAGMA synchronous=FULL")  # litequeue sets NORMAL on open
    start = time.perf_counter()
    for first in range(0, jobs, BATCH):
        with queue.transaction(mode="IMMEDIATE"):
            for n in range(first, min(first + BATCH, jobs)):
                queue.put(f'{{"n":{n}}}')
    enqueued, handled = time.perf_counter(), 0
    while (message := queue.pop()) is not None:
        queue.done(message.message_id)
        handled += 1
    drained = time.perf_counter()
    pragmas = read_pragmas(queue.conn)
    queue.close()
    check_drained("litequeue", handled, jobs)
    return Sample(enqueued - start, drained - enqueued, pragmas, 1)


def persist_queue_consume(queue: Any, counts: list[int], slot: int) -> None:
    from persistqueue.exceptions import Empty

    while True:
        try:
            item = queue.get(block=False, raw=True)
        except Empty:
            return
        queue.ack(id=item["pqid"])
        counts[slot] += 1


def persist_queue_drain(queue: Any, threads: int) -> list[int]:
    counts = [0] * threads
    if threads == 1:  # in this thread, as its own connection requires without multithreading=True
        persist_queue_consume(queue, counts, 0)
        return counts
    workers = [threading.Thread(target=persist_queue_consume, args=(queue, counts, i)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return counts


def persist_queue_pragmas(queue: Any) -> str:
    """Both of its connections: the getter, and the putter (a second one with ``multithreading=True``)."""
    return " + ".join(sorted({read_pragmas(queue._getter), read_pragmas(queue._putter)}))


def persist_queue_run(path: Path, jobs: int, threads: int) -> Sample:
    from persistqueue import SQLiteAckQueue

    queue = SQLiteAckQueue(str(path / "persist-queue"), multithreading=threads > 1)
    start = time.perf_counter()
    for n in range(jobs):
        queue.put({"n": n})
    enqueued = time.perf_counter()
    counts = persist_queue_drain(queue, threads)
    drained = time.perf_counter()
    pragmas = persist_queue_pragmas(queue)
    queue.close()
    check_drained("persist-queue", sum(counts), jobs)
    return Sample(enqueued - start, drained - enqueued, pragmas, sum(1 for count in counts if count))


def peer_sides() -> list[Side]:
    sides = [
        Side("huey SqliteHuey", "wal, fsync=True", 1, "task() ×1", huey_run),
        Side("litequeue", "WAL + synchronous=FULL", 1, f"put ×{BATCH} in transaction()", litequeue_run),
        *(Side(PQ, "WAL+FULL (default)", n, "put ×1", partial(persist_queue_run, threads=n)) for n in (1, 4)),
    ]
    installed = {name for name, module in PEERS.items() if importlib.util.find_spec(module) is not None}
    return [side for side in sides if side.name.split()[0] in installed]


def all_sides() -> list[Side]:
    produce = f"enqueue_many ×{BATCH}"
    pool = [Side(POOL, m, n, produce, partial(asyncq_run, mode=m, tasks=n)) for m in MODES for n in TASK_COUNTS]
    floor = Side(FLOOR, "WAL+FULL", 1, "INSERT ×1", floor_run)
    return [*pool, floor, *peer_sides()]


# -- running and reporting ---------------------------------------------------------------------------


def measure(sides: Sequence[Side], settings: Settings) -> str:
    """``settings.runs`` rounds; each round runs every side once on a fresh file, in a rotated order.

    Returns the machine's 1-minute load average before and after, to show how busy the machine was."""
    before = os.getloadavg()[0]
    for round_no in range(settings.runs):
        shift = round_no % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            with tempfile.TemporaryDirectory(prefix="asyncq-throughput-") as scratch:
                side.samples.append(side.run(Path(scratch), settings.jobs))
        print(f"round {round_no + 1}/{settings.runs} done", flush=True)
    return f"load average (1 min) {before:.1f} before, {os.getloadavg()[0]:.1f} after"


def is_pool(side: Side, mode: str = "full") -> bool:
    return side.name == POOL and side.mode == mode


def best_peer(sides: Sequence[Side], jobs: int) -> Side | None:
    peers = [side for side in sides if side.name not in (POOL, FLOOR)]
    return max(peers, key=lambda side: side.median(end_to_end(jobs)), default=None)


def ratio(value: float, against: Side | None, jobs: int) -> str:
    return "–" if against is None else f"{value / against.median(end_to_end(jobs)):.1f}×"


def result_rows(sides: Sequence[Side], jobs: int) -> list[list[str]]:
    floor = next(side for side in sides if side.name == FLOOR)
    peer = best_peer(sides, jobs)
    rows = []
    for side in sides:
        rate = side.median(end_to_end(jobs))
        runs = [end_to_end(jobs)(sample) for sample in side.samples]
        commits = statistics.median(sample.commits for sample in side.samples)
        rows.append(
            [
                side.name,
                side.mode,
                ", ".join(sorted({sample.pragmas for sample in side.samples})),
                str(side.tasks),
                side.producer,
                f"{rate:,.0f}",
                f"{min(runs):,.0f}–{max(runs):,.0f}",
                f"{side.median(lambda s: jobs / s.enqueue_s):,.0f}",
                f"{side.median(lambda s: jobs / s.drain_s):,.0f}",
                str(min(sample.peak for sample in side.samples)),
                f"{jobs / commits:.1f}" if commits else "–",
                ratio(rate, floor, jobs),
                ratio(rate, peer, jobs),
            ]
        )
    return rows


RATE_HEADERS = ("jobs/s", "range", "enqueue jobs/s", "drain jobs/s", "peak", "jobs/commit", "× floor", "× best peer")
HEADERS = ("side", "durability asked", "read back", "tasks", "producer", *RATE_HEADERS)


CHECK_HEADERS = ("target", "measured", "verdict")


@dataclass(frozen=True)
class Check:
    name: str
    value: str
    ok: bool


def target_checks(sides: Sequence[Side], jobs: int) -> list[Check]:
    """The issue's targets, on the fully durable pool (``full``) at every task count of 4 or more."""
    rate = end_to_end(jobs)
    floor = next(side for side in sides if side.name == FLOOR).median(rate)
    peer = best_peer(sides, jobs)
    pools = {side.tasks: side for side in sides if is_pool(side)}
    checks = []
    for tasks in (n for n in TASK_COUNTS if n >= 4):
        mine = pools[tasks].median(rate)
        checks.append(Check(f"full, {tasks} tasks ≥ 4× the stdlib floor", f"{mine / floor:.1f}×", mine >= 4 * floor))
        if peer is not None:
            theirs = peer.median(rate)
            consumers = f"{peer.tasks} consumer thread{'s' if peer.tasks > 1 else ''}"
            name = f"full, {tasks} tasks ≥ 3× the fastest durable peer ({peer.name}, {consumers})"
            checks.append(Check(name, f"{mine / theirs:.1f}×", mine >= 3 * theirs))
    at_64, at_4 = pools[64].median(rate), pools[4].median(rate)
    checks.append(Check("full, 64 tasks ≥ 4 tasks", f"{at_64:,.0f} vs {at_4:,.0f} jobs/s", at_64 >= at_4))
    busy = all(sample.peak == side.tasks for side in sides if side.name == POOL for sample in side.samples)
    checks.append(Check("every task slot busy: peak handlers = tasks, every asyncq run", "yes" if busy else "no", busy))
    return checks


def peer_versions() -> str:
    found = [name for name, module in PEERS.items() if importlib.util.find_spec(module) is not None]
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in found) or "none installed"


NOTES = """\
- **jobs/s** = jobs / (enqueue time + drain time), the median of the runs; **range** is the slowest and fastest run.
  **enqueue** and **drain jobs/s** are each phase's own median. Ratios are of the medians of this invocation.
- **producer**: the enqueue call, and the jobs each of its commits carries (huey and persist-queue have no bulk put:
  one commit per job). litequeue 0.9 is the newest release on the package index used here that installs on
  Python 3.11 (later releases need 3.12).
- **read back**: `PRAGMA journal_mode` and `PRAGMA synchronous` on the connection each side used (asyncq through
  `Queue.transaction()`, huey `huey.storage.conn`, litequeue `queue.conn`, persist-queue its getter and putter).
- **peak**: asyncq, the most handlers running at once (the no-op handler awaits `asyncio.sleep(0)`; reaching N
  shows all N worker tasks busy at once); the least over the runs.
  Peers: consumer threads that took at least one job (they are synchronous libraries; one consumer thread each,
  and persist-queue also with four, `multithreading=True`, though its `action_lock` serialises get and ack).
- **jobs/commit**: jobs per commit of the pool's batcher while draining. Each batcher commit finishes the jobs
  done so far and claims jobs for the free slots and the prefetch buffer (a batch and a round) in one transaction,
  so a freed slot starts its next job while the commit is written; a commit waits for a batch of 128 results (a
  round of the slots above 128, eight rounds below 16) unless a slot starves or the oldest result has waited
  60 ms.
  From the peers' code, their commits per job: floor 3 (insert, claim, finish); huey 2 (insert;
  `dequeue` deletes the row, so a finished job leaves no record; `execute` also opens a `begin exclusive` to pop
  the revoke key, which writes nothing); litequeue 2 + 1/500 (pop, done; puts batched in its `transaction()`);
  persist-queue 3 (put; get marks the row unacked; ack). persist-queue's `get` walks the table in rowid order
  past every acked row (no index on status), so its drain slows as history grows.
- `normal` (WAL+NORMAL) may lose the last commits on power loss; it is shown for scale, not for the targets.
"""


def check_rows(checks: Sequence[Check]) -> list[list[str]]:
    return [[check.name, check.value, _report.verdict(check.ok)] for check in checks]


def section(sides: Sequence[Side], settings: Settings, load: str) -> str:
    rows, checks = result_rows(sides, settings.jobs), target_checks(sides, settings.jobs)
    return "\n\n".join(
        [
            "## Throughput: enqueue → claim → no-op handler → finish",
            f"`{COMMAND}`: {settings.jobs:,} jobs per run, {settings.runs} runs per side, fresh file per run, "
            f"sides alternating. {_report.environment()}; {load}. Peers: {peer_versions()}.",
            _report.markdown_table(HEADERS, rows),
            _report.markdown_table(CHECK_HEADERS, check_rows(checks)),
            NOTES,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few jobs, 2 runs, writes nothing")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 1,500; 200 with --quick)")
    args = parser.parse_args(argv)
    settings = QUICK_RUN if args.quick else FULL_RUN
    if args.jobs:
        settings = Settings(jobs=args.jobs, runs=settings.runs)
    sides = all_sides()
    load = measure(sides, settings)
    _report.print_table(f"throughput (jobs/s, medians; {load})", HEADERS, result_rows(sides, settings.jobs))
    _report.print_table("targets", CHECK_HEADERS, check_rows(target_checks(sides, settings.jobs)))
    if not args.quick:
        print(f"wrote {_report.write_section(SECTION, section(sides, settings, load))}")


if __name__ == "__main__":
    main()
