"""Claim cost against queue depth, and the lab loop's throughput against a bare sqlite3 loop.

1. Depth: median and p90 latency of one ``asyncq.lab.lease.claim`` + ``finish(ok)`` pair on queue files opened
   with ``open_queue`` (DELETE journal, synchronous FULL: the lease lab contract), with 1,000, 100,000 and
   1,000,000 pending, available jobs queued, behind a history of 10% of the depth done and 1% dead, a few jobs
   leased by another worker and a few retries in backoff. Fixtures are bulk-loaded by SQL, untimed. The depths
   are sampled in alternating rounds, so drift in the disk's speed falls on all of them alike. FULL commits are
   fsync-bound, so every depth is measured again on the same connections with ``synchronous=OFF`` (no fsync,
   but the journal file is still created and deleted per commit) and with ``journal_mode=MEMORY`` plus
   ``synchronous=OFF`` (no file work at commit: the statements' own cost). Target: 1M/1k ratio <= 1.5.
2. Throughput: jobs/s of ``enqueue`` + ``run_once`` (no-op ``send``, jitter 0.5) against a stdlib loop running
   the same statements in the same ``BEGIN IMMEDIATE`` transactions without validation, in the same three modes.
   Each run opens both sides on fresh files and alternates them job by job (each side's time summed apart), so
   noise from other processes falls on both alike. Target: lab >= 0.9x the bare loop in DELETE/FULL.
3. EXPLAIN QUERY PLAN of the sweep, claim and finish statements on the deepest fixture: each must seek an index.

Run ``.venv/bin/python benchmarks/claim_depth.py`` (a minute or two; rewrites its section of
docs/benchmarks.md), or add ``--quick`` for a smoke run (1k and 10k jobs, few samples, < 20 s, writes nothing).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

import _report

from asyncq.lab import lease
from asyncq.store.sqlite.schema import LAB
from asyncq.store.sqlite.statements import (
    FinishChange,
    FinishRow,
    finish_params,
    finish_rows,
    insert_rows,
    select_by_ids,
    sql,
)

COMMAND = ".venv/bin/python benchmarks/claim_depth.py"
T0 = 10**12  # where every fixture's clock starts, on the contract's time base
TTL_MS = 60_000  # the largest ttl the contract allows; the run's clock stays far below T0 + TTL_MS
OWNER = "bench"
IN_FLIGHT = 16  # jobs leased by another worker, lease valid for the whole run
BACKING_OFF = 32  # older retries not available before the run ends: every claim walks past them
LOAD_BATCH = 250_000
INSERT_ROW = """INSERT INTO jobs (id, qty, status, attempts, max_attempts, token, available_at, deadline, owner,
  lease_until, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
PLANNED = ("SWEEP_DEADLINE", "SWEEP_EXHAUSTED", "CLAIM", "SELECT_BY_IDS", "FINISH_ROWS")
CONTRACT = "DELETE/FULL"
MODES = {CONTRACT: "contract", "DELETE/OFF": "no fsync", "MEMORY/OFF": "statements only"}  # journal/sync
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
Row = tuple[str, int, str, int, int, int, int, int, str | None, int | None, str | None]


@dataclass(frozen=True)
class Settings:
    depths: tuple[int, ...]
    samples: int  # claim+finish pairs per depth and mode
    warmup: int  # untimed claim+finish pairs per depth and mode; untimed jobs per throughput run
    runs: int  # throughput runs per side and mode
    jobs: int  # jobs per throughput run


FULL_RUN = Settings(depths=(1_000, 100_000, 1_000_000), samples=200, warmup=10, runs=7, jobs=500)
QUICK_RUN = Settings(depths=(1_000, 10_000), samples=40, warmup=5, runs=5, jobs=60)


class Clock:
    """A monotonic millisecond counter on the contract's time base: each reading is one ms after the last."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


@dataclass
class Fixture:
    depth: int
    con: sqlite3.Connection
    clock: Clock


def set_mode(con: sqlite3.Connection, mode: str) -> str:
    """Switch ``con`` to ``mode`` (``"JOURNAL/SYNC"``) and return the mode it reports back."""
    journal, synchronous = mode.split("/")
    con.execute(f"PRAGMA journal_mode={journal}")
    con.execute(f"PRAGMA synchronous={synchronous}")
    reported = con.execute("PRAGMA journal_mode").fetchone()[0]
    return f"{str(reported).upper()}/{SYNC_NAMES[con.execute('PRAGMA synchronous').fetchone()[0]]}"


# --- fixtures -------------------------------------------------------------------------------------------------


def history_rows(depth: int) -> Iterator[Row]:
    """Jobs finished before the run, older than every queued one: 10% of the depth done, 1% dead."""
    old = T0 - 150_000
    for i in range(depth // 10):
        yield (f"done-{i}", 1 + i % 1000, "done", 1, 3, 1, old, old + TTL_MS, None, None, None)
    reasons = ("exhausted", "deadline", "permanent")
    for i in range(depth // 100):
        reason = reasons[i % 3]
        attempts = 3 if reason == "exhausted" else 1
        yield (f"dead-{i}", 1 + i % 1000, "dead", attempts, 3, attempts, old, old + TTL_MS, None, None, reason)


def busy_rows() -> Iterator[Row]:
    """Jobs another worker holds for the whole run, and retries whose backoff outlasts the run."""
    deadline = T0 - 1 + TTL_MS
    for i in range(IN_FLIGHT):
        yield (f"held-{i}", 1 + i, "leased", 1, 3, 1, T0 - 1, deadline, "other", deadline, None)
    for i in range(BACKING_OFF):
        yield (f"retry-{i}", 1 + i, "pending", 1, 3, 1, T0 + 50_000, deadline, None, None, "retry")


def queued_rows(depth: int) -> Iterator[Row]:
    """``depth`` pending jobs, all available, enqueued just before the run with the largest ttl."""
    for i in range(depth):
        yield (f"job-{i}", 1 + i % 1000, "pending", 0, 3, 0, T0 - 1, T0 - 1 + TTL_MS, None, None, None)


def batches(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    while batch := list(islice(rows, size)):
        yield batch


def load_fixture(path: Path, depth: int) -> None:
    """Create the lab schema with ``open_queue``, then bulk-insert the rows with durability off."""
    lease.open_queue(path).close()
    con = sqlite3.connect(path, isolation_level=None)
    try:
        set_mode(con, "MEMORY/OFF")
        con.execute("PRAGMA cache_size=-262144")
        rows = chain(history_rows(depth), busy_rows(), queued_rows(depth))
        for batch in batches(rows, LOAD_BATCH):
            con.execute("BEGIN IMMEDIATE")
            con.executemany(INSERT_ROW, batch)
            con.execute("COMMIT")
    finally:
        con.close()


def open_fixtures(folder: Path, depths: Sequence[int]) -> list[Fixture]:
    """Bulk-load one queue file per depth, then open each with ``open_queue``."""
    fixtures = []
    for depth in depths:
        path = folder / f"depth-{depth}.db"
        load_fixture(path, depth)
        fixtures.append(Fixture(depth, lease.open_queue(path), Clock()))
    return fixtures


# --- claim + finish against depth -----------------------------------------------------------------------------


def time_pair(fixture: Fixture) -> int:
    """Nanoseconds for one claim and its ``finish(ok)``."""
    start = time.perf_counter_ns()
    ticket = lease.claim(fixture.con, OWNER, fixture.clock())
    if ticket is None:
        raise RuntimeError(f"the {fixture.depth} queue ran dry")
    status = lease.finish(fixture.con, ticket, "ok", fixture.clock())
    elapsed = time.perf_counter_ns() - start
    if status != "done":
        raise RuntimeError(f"finish returned {status!r}")
    return elapsed


def sample_depths(fixtures: Sequence[Fixture], mode: str, settings: Settings) -> tuple[dict[int, list[int]], str]:
    """Claim+finish latencies per depth in one mode, the depths taking turns pair by pair."""
    reported = {set_mode(fixture.con, mode) for fixture in fixtures}
    for fixture in fixtures:
        for _ in range(settings.warmup):
            time_pair(fixture)
    times: dict[int, list[int]] = {fixture.depth: [] for fixture in fixtures}
    for _ in range(settings.samples):
        for fixture in fixtures:
            times[fixture.depth].append(time_pair(fixture))
    if any(fixture.clock.now >= T0 + 40_000 for fixture in fixtures):
        raise RuntimeError("the clock reached the fixture's backoffs and deadlines: take fewer samples")
    return times, "+".join(sorted(reported))


def query_plans(con: sqlite3.Connection, now: int) -> dict[str, list[str]]:
    """EXPLAIN QUERY PLAN detail lines of each sweep, claim and finish statement."""
    params = {"now": now, "owner": OWNER, "lease_ms": 1000, "limit": 1, "count": 1}
    positional = {
        "SELECT_BY_IDS": ("job-0",),
        "FINISH_ROWS": finish_params(
            FinishChange("done", None, now, 0, OWNER), [FinishRow(1, "job-0", 1, 1, now + 1000, 3, now + TTL_MS)]
        ),
    }
    return {
        name: [row[3] for row in con.execute(f"EXPLAIN QUERY PLAN {statement(name)}", positional.get(name, params))]
        for name in PLANNED
    }


def statement(name: str) -> str:
    """The lab's statement ``name``; ``SELECT_BY_IDS`` and ``FINISH_ROWS`` as the engine sends them for one job."""
    if name == "SELECT_BY_IDS":
        return select_by_ids(LAB, 1)
    return finish_rows(LAB, 1) if name == "FINISH_ROWS" else sql(LAB, name)


def full_scans(plans: dict[str, list[str]]) -> list[str]:
    """Plan lines that read the whole jobs table (or a whole index of it) instead of seeking."""
    return [f"{name}: {line}" for name, lines in plans.items() for line in lines if line.startswith("SCAN jobs")]


# --- lab loop against a bare loop -----------------------------------------------------------------------------


def accept(_event: dict[str, Any]) -> bool:
    return True


class LabLoop:
    """The lab's ``enqueue`` + ``run_once``, one job at a time, on a fresh file opened with ``open_queue``."""

    def __init__(self, path: Path, mode: str) -> None:
        self.con, self.clock = lease.open_queue(path), Clock()
        self.mode = set_mode(self.con, mode)

    def job(self, i: int) -> None:
        lease.enqueue(self.con, {"id": f"job-{i}", "qty": 1 + i % 1000}, self.clock(), TTL_MS)
        result = lease.run_once(self.con, OWNER, self.clock, accept, 0.5)
        if result is None or result["status"] != "done":
            raise RuntimeError(f"run_once returned {result!r}")


class BareLoop:
    """The lab's statements in its transactions (3 per job) on a plain connection, with no validation."""

    SELECT, INSERT, CLAIM, FINISH = select_by_ids(LAB, 1), insert_rows(LAB, 1), sql(LAB, "CLAIM"), finish_rows(LAB, 1)
    SWEEPS = (sql(LAB, "SWEEP_DEADLINE"), sql(LAB, "SWEEP_EXHAUSTED"))

    def __init__(self, path: Path, mode: str) -> None:
        lease.open_queue(path).close()  # the schema only
        self.con, self.clock = sqlite3.connect(path, isolation_level=None, timeout=1.0), Clock()
        self.mode = set_mode(self.con, mode)

    def job(self, i: int) -> None:
        job_id, now = f"job-{i}", self.clock()
        self.con.execute("BEGIN IMMEDIATE")
        if self.con.execute(self.SELECT, (job_id,)).fetchone() is None:
            self.con.execute(self.INSERT, (job_id, 1 + i % 1000, 3, now, now + TTL_MS)).fetchall()
        self.con.execute("COMMIT")
        params = {"now": self.clock(), "owner": OWNER, "lease_ms": 1000, "limit": 1, "count": 1}
        self.con.execute("BEGIN IMMEDIATE")
        for sweep in self.SWEEPS:
            self.con.execute(sweep, params)
        _seq, claimed_id, qty, _owner, token, *_rest = self.con.execute(self.CLAIM, params).fetchone()
        self.con.execute("COMMIT")
        accept({"id": claimed_id, "qty": qty})
        now = self.clock()
        self.con.execute("BEGIN IMMEDIATE")
        seq, _id, _qty, _status, attempts, max_attempts, token, _owner, lease_until, deadline, _reason = (
            self.con.execute(self.SELECT, (claimed_id,)).fetchone()
        )
        row = FinishRow(seq, claimed_id, token, attempts, lease_until, max_attempts, deadline)
        change = finish_params(FinishChange("done", None, now, 0, OWNER), [row])
        if not self.con.execute(self.FINISH, change).fetchall():
            raise RuntimeError(f"the bare loop's finish of {claimed_id} did not land")
        self.con.execute("COMMIT")


SIDES: dict[str, type[LabLoop | BareLoop]] = {"lab": LabLoop, "bare": BareLoop}


@dataclass
class LoopResult:
    rates: list[float]  # jobs/s, one per run
    mode: str  # journal/sync the side's connection reported


def interleaved_run(folder: Path, run: int, mode: str, settings: Settings) -> dict[str, tuple[float, str]]:
    """One run: both sides on fresh files, job by job in alternating order, each side's time summed apart.

    Disk and CPU noise thus falls on both sides alike. The first ``warmup`` jobs are not timed."""
    stem = mode.replace("/", "-")
    loops = {side: kind(folder / f"{side}-{stem}-{run}.db", mode) for side, kind in SIDES.items()}
    spent = dict.fromkeys(loops, 0)
    try:
        for i in range(settings.warmup + settings.jobs):
            for side in list(loops) if (run + i) % 2 == 0 else list(reversed(loops)):
                start = time.perf_counter_ns()
                loops[side].job(i)
                elapsed = time.perf_counter_ns() - start
                if i >= settings.warmup:
                    spent[side] += elapsed
    finally:
        for loop in loops.values():
            loop.con.close()
    return {side: (settings.jobs * 1e9 / spent[side], loop.mode) for side, loop in loops.items()}


def compare_loops(folder: Path, mode: str, settings: Settings) -> dict[str, LoopResult]:
    """Jobs/s per run for each side over ``settings.runs`` interleaved runs."""
    results = {side: LoopResult([], "") for side in SIDES}
    for run in range(settings.runs):
        for side, (rate, reported) in interleaved_run(folder, run, mode, settings).items():
            results[side].rates.append(rate)
            results[side].mode = reported
    return results


# --- results --------------------------------------------------------------------------------------------------

DEPTH_HEADERS = ["queued jobs", "journal/sync", "pairs", "median µs", "p90 µs", "vs smallest"]
LOOP_HEADERS = ["loop", "journal/sync", "runs", "median jobs/s", "range jobs/s", "vs bare"]


@dataclass
class Results:
    latencies: dict[str, dict[int, list[int]]]  # mode -> depth -> ns per claim+finish pair
    depth_modes: dict[str, str]  # mode -> journal/sync the fixture connections reported
    loops: dict[str, dict[str, LoopResult]]  # mode -> side -> runs
    plans: dict[str, list[str]]  # on the deepest fixture
    load_seconds: float


def measure(folder: Path, settings: Settings) -> Results:
    started = time.perf_counter()
    fixtures = open_fixtures(folder, settings.depths)
    load_seconds = time.perf_counter() - started
    latencies, reported = {}, {}
    try:
        plans = query_plans(fixtures[-1].con, fixtures[-1].clock.now)
        for mode in MODES:
            latencies[mode], reported[mode] = sample_depths(fixtures, mode, settings)
    finally:
        for fixture in fixtures:
            fixture.con.close()
    loops = {mode: compare_loops(folder, mode, settings) for mode in MODES}
    return Results(latencies, reported, loops, plans, load_seconds)


def depth_ratio(times: dict[int, list[int]]) -> float:
    return statistics.median(times[max(times)]) / statistics.median(times[min(times)])


def loop_ratio(sides: dict[str, LoopResult]) -> float:
    return statistics.median(sides["lab"].rates) / statistics.median(sides["bare"].rates)


def paired_ratios(sides: dict[str, LoopResult]) -> list[float]:
    """lab/bare within each run: both sides saw the same moments of the machine."""
    return sorted(lab / bare for lab, bare in zip(sides["lab"].rates, sides["bare"].rates, strict=True))


def depth_table(results: Results) -> list[list[object]]:
    rows: list[list[object]] = []
    for mode, times in results.latencies.items():
        base = statistics.median(times[min(times)])
        label = f"{results.depth_modes[mode]} ({MODES[mode]})"
        for depth, values in times.items():
            median, p90 = statistics.median(values), _report.percentile(values, 90)
            rows.append(
                [f"{depth:,}", label, len(values), f"{median / 1e3:.1f}", f"{p90 / 1e3:.1f}", f"{median / base:.2f}"]
            )
    return rows


def loop_table(results: Results) -> list[list[object]]:
    rows: list[list[object]] = []
    for mode, sides in results.loops.items():
        bare = statistics.median(sides["bare"].rates)
        for side, result in sides.items():
            median, spread = statistics.median(result.rates), f"{min(result.rates):.0f}-{max(result.rates):.0f}"
            label = f"{result.mode} ({MODES[mode]})"
            rows.append([side, label, len(result.rates), f"{median:.0f}", spread, f"{median / bare:.2f}"])
    return rows


def verdicts(results: Results) -> list[str]:
    """One line per ratio (deepest/shallowest claim+finish per mode, lab/bare loop per mode), then the plans."""
    lines = []
    for mode, times in results.latencies.items():
        ratio = depth_ratio(times)
        lines.append(
            f"claim+finish, {max(times):,} vs {min(times):,} queued, {results.depth_modes[mode]} ({MODES[mode]}): "
            f"{ratio:.2f}x (target <= 1.5: {_report.verdict(ratio <= 1.5)})"
        )
    for mode, sides in results.loops.items():
        ratio = loop_ratio(sides)
        target = f"target >= 0.9: {_report.verdict(ratio >= 0.9)}" if mode == CONTRACT else "no target"
        paired = paired_ratios(sides)
        per_run = f"per run: median {statistics.median(paired):.2f}, {paired[0]:.2f}-{paired[-1]:.2f}"
        lines.append(
            f"enqueue+run_once, lab vs bare, {sides['lab'].mode} ({MODES[mode]}): {ratio:.2f}x ({per_run}; {target})"
        )
    scans = full_scans(results.plans)
    seeks = "every sweep, claim and finish statement seeks an index"
    lines.append(f"query plans: {seeks}" if not scans else "query plans: full scans in " + "; ".join(scans))
    return lines


def markdown(results: Results, settings: Settings) -> str:
    plans = [f"{name}: {line}" for name, lines in results.plans.items() for line in lines]
    return f"""## Claim cost against queue depth; lab loop against a bare sqlite3 loop (`claim_depth`)

Produced by `{COMMAND}` ({_report.environment()}). How it measures is in the script's docstring.

### claim + finish(ok) latency ({settings.samples} pairs per row after {settings.warmup} warm-up pairs)

Each queue also holds 10% of its depth done, 1% dead, {IN_FLIGHT} jobs leased by another worker and
{BACKING_OFF} older retries in backoff. DELETE/FULL is what the contract runs: two fsync-bound commits per pair.
The other modes are set on the same connections: DELETE/OFF still creates and deletes the journal file per
commit; MEMORY/OFF does no file work at commit, leaving the statements' own cost.

{_report.markdown_table(DEPTH_HEADERS, depth_table(results))}

### enqueue + run_once throughput ({settings.runs} runs of {settings.jobs} jobs per side and mode)

`lab`: `asyncq.lab.lease.enqueue` + `run_once` (no-op `send`, jitter 0.5). `bare`: the same statements in the
same `BEGIN IMMEDIATE` transactions (3 per job) on a plain `sqlite3` connection, without validation.
In each run the two sides alternate job by job, each on its own fresh file; each side's time is summed apart.

{_report.markdown_table(LOOP_HEADERS, loop_table(results))}

### Targets

{chr(10).join(f"- {line}" for line in verdicts(results))}

### Query plans at {max(settings.depths):,} queued jobs

```text
{chr(10).join(plans)}
```
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k/10k jobs, few samples; docs are not written")
    args = parser.parse_args(argv)
    settings = QUICK_RUN if args.quick else FULL_RUN
    with tempfile.TemporaryDirectory(prefix="asyncq-claim-depth-") as folder:
        results = measure(Path(folder), settings)
    print(f"{_report.environment()}; fixtures loaded in {results.load_seconds:.1f} s (untimed)\n")
    _report.print_table("claim + finish(ok) latency", DEPTH_HEADERS, depth_table(results))
    _report.print_table("enqueue + run_once throughput", LOOP_HEADERS, loop_table(results))
    print("\n".join(verdicts(results)))
    print("\n".join(f"  {name}: {line}" for name, lines in results.plans.items() for line in lines))
    if not args.quick:
        print(f"\nwrote {_report.write_section('claim_depth', markdown(results, settings))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
