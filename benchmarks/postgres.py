"""asyncq on PostgreSQL beside pgqueuer and procrastinate: the same workload on the same server and settings.

Each run takes a fresh database on the server (``$ASYNCQ_BENCH_POSTGRES``, default
``postgresql://postgres@127.0.0.1:5432/postgres``), made with ``synchronous_commit = on`` as its default and
dropped after the run; the server's ``fsync`` and ``synchronous_commit`` are read back and must be on. A run:

1. the library's schema (``benchmarks/postgres_libraries.py`` says how each is called);
2. **enqueue**: ``--jobs`` jobs in batches of ``--batch``, from this process;
3. **drain**: 1, 2 or 4 worker processes, already set up and waiting, are told to go at once; each runs the
   library's worker with 16 concurrent no-op ``async`` handlers until nothing is left; the drain ends when the
   last process reports. Every job must have run once and none may be left unfinished, or the run is refused.

**End to end** is ``jobs / (enqueue time + drain time)``. The libraries alternate run by run (the order rotates),
each process count in turn, so drift of the machine falls on all alike; tables hold medians, and the ratios
come from the same invocation. CPU: the worker processes' own (``resource.getrusage``), and the server's for
their connections (the backends' ``/proc/<pid>/stat``, sampled every 0.1 s and once more when the last process is
done, before any closes), per 1,000 jobs drained.

    python benchmarks/postgres.py [--jobs 20000] [--rounds 3] [--quick]

``--quick``: a smoke run (300 jobs, 1 and 2 processes, one round, unless given) that writes nothing to
docs/benchmarks.md. Peers that are not installed are skipped. The peers come with ``pip install -e '.[peers]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "benchmarks"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from benchmarks._report import markdown_table, print_table, verdict, write_section  # noqa: E402
from benchmarks.postgres_libraries import LIBRARIES, Library, installed, version  # noqa: E402

SERVER = os.environ.get("ASYNCQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
SECTION = "postgres"
TASKS = 16
PROCESSES = (1, 2, 4)
TARGET_PEER_RATIO = 2.0
TARGET_SCALING = 1.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CPUS = os.cpu_count() or 1


@dataclass(frozen=True)
class Sample:
    library: str
    processes: int
    enqueue_s: float
    drain_s: float
    worker_cpu_s: float
    server_cpu_s: float
    busy: float  # the machine's CPUs busy during the drain, 0-1 (every process on it, the benchmark's or not)
    jobs: int

    @property
    def end_to_end(self) -> float:
        return self.jobs / (self.enqueue_s + self.drain_s)

    @property
    def own_cores(self) -> float:
        """CPUs the drain kept busy with this library's work: its workers' and their backends' CPU over its time."""
        return (self.worker_cpu_s + self.server_cpu_s) / self.drain_s


# -- one worker process -------------------------------------------------------------------------------------


async def worker(library_name: str, url: str) -> None:
    """A drain worker: READY once set up; drain on GO; then DONE with the jobs it ran and the CPU seconds it spent
    since GO; close its connections on CLOSE."""
    library = LIBRARIES[library_name][1]()
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    cpu_at_go = 0.0

    async def expect(word: bytes) -> None:
        line = await stdin.readline()
        if line.strip() != word:
            raise SystemExit(f"expected {word!r}, got {line!r}")

    async def ready() -> None:
        nonlocal cpu_at_go
        print("READY", flush=True)
        await expect(b"GO")
        cpu_at_go = cpu_seconds()

    async def drained(handled: int) -> None:
        print(f"DONE {handled} {cpu_seconds() - cpu_at_go:.4f}", flush=True)
        await expect(b"CLOSE")

    await library.drain(url, TASKS, ready, drained)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the conductor ------------------------------------------------------------------------------------------


async def admin(statement: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(SERVER)
    try:
        return list(await conn.fetch(statement, *args))
    finally:
        await conn.close()


def database_url(name: str) -> str:
    return SERVER.rsplit("/", 1)[0] + "/" + name


def process_cpu(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used (``None`` once it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


class BackendCpu:
    """The server's CPU for one database's connections, sampled while they live (a backend ends with its
    connection): the growth of each backend's CPU since the first sample, summed."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    async def sample(self) -> None:
        rows = await admin("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database)
        for row in rows:
            cpu = process_cpu(row["pid"])
            if cpu is not None:
                self.first.setdefault(row["pid"], cpu)
                self.last[row["pid"]] = cpu

    @property
    def seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)

    async def watch(self, every: float = 0.1) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(every)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def cpu_times() -> tuple[int, int]:
    """The machine's (busy, total) CPU time so far, in ticks (``/proc/stat``; idle and iowait are not busy)."""
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


async def drain(library_name: str, url: str, database: str, processes: int) -> tuple[float, int, float, float, float]:
    """Start ``processes`` workers, let them go at once, wait for the last to report; (seconds, jobs run,
    workers' CPU s, server CPU s)."""
    command = [sys.executable, __file__, "--worker", library_name, url]
    pipe = asyncio.subprocess.PIPE
    children = [
        await asyncio.create_subprocess_exec(*command, stdin=pipe, stdout=pipe, env=child_env())
        for _ in range(processes)
    ]
    server = BackendCpu(database)
    watcher: asyncio.Task[None] | None = None
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 120)
            if line.strip() != b"READY":
                raise RuntimeError(f"a {library_name} worker did not start (it said {line!r})")
        await server.sample()  # the backends of the set-up connections: their CPU from here on
        watcher = asyncio.create_task(server.watch())
        started, machine = time.perf_counter(), cpu_times()
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"GO\n")
        lines = [await asyncio.wait_for(child.stdout.readline(), 900) for child in children if child.stdout]
        elapsed, (busy, total) = time.perf_counter() - started, cpu_times()
        busy_share = (busy - machine[0]) / max(1, total - machine[1])
        watcher.cancel()
        await server.sample()  # the connections are still open: their backends' last figures
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"CLOSE\n")
        handled, cpu = 0, 0.0
        for line in lines:
            if not line.startswith(b"DONE "):
                raise RuntimeError(f"a {library_name} worker ended with {line!r}")
            _word, count, seconds = line.split()
            handled += int(count)
            cpu += float(seconds)
        return elapsed, handled, cpu, server.seconds, busy_share
    finally:
        if watcher is not None:
            watcher.cancel()
        for child in children:
            try:
                await asyncio.wait_for(child.wait(), 30)
            except TimeoutError:
                child.kill()
                await child.wait()


async def one_run(library_name: str, processes: int, jobs: int, batch: int) -> Sample:
    """One run in a fresh database: install, enqueue, drain, check; the database dropped at the end."""
    library: Library = LIBRARIES[library_name][1]()
    database = f"asyncq_bench_{library_name}_{uuid.uuid4().hex[:8]}"
    await admin(f"CREATE DATABASE {database}")
    try:
        await admin(f"ALTER DATABASE {database} SET synchronous_commit = on")
        url = database_url(database)
        await library.install(url)
        enqueue_s = await library.enqueue(url, jobs, batch)
        drain_s, handled, worker_cpu, server_cpu, busy = await drain(library_name, url, database, processes)
        left = await library.unfinished(url)
        if handled != jobs or left != 0:
            raise RuntimeError(f"{library_name} ran {handled} of {jobs} jobs and left {left} unfinished")
    finally:
        await admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    return Sample(library_name, processes, enqueue_s, drain_s, worker_cpu, server_cpu, busy, jobs)


async def server_settings() -> dict[str, str]:
    rows = await admin(
        "SELECT name, setting FROM pg_settings WHERE name IN "
        "('server_version', 'fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers', 'max_connections')"
    )
    return {row["name"]: row["setting"] for row in rows}


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


async def measure(names: list[str], processes: tuple[int, ...], jobs: int, batch: int, rounds: int) -> list[Sample]:
    """Every library at every process count, ``rounds`` times, the libraries' order rotating run by run."""
    samples: list[Sample] = []
    turn = 0
    for round_ in range(rounds):
        for count in processes:
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for name in order:
                sample = await one_run(name, count, jobs, batch)
                samples.append(sample)
                print(
                    f"round {round_ + 1} {name:<13} {count} process(es): enqueue {jobs / sample.enqueue_s:>8,.0f}/s"
                    f"  drain {jobs / sample.drain_s:>8,.0f}/s  end to end {sample.end_to_end:>8,.0f}/s"
                    f"  (load {load()})",
                    flush=True,
                )
    return samples


# -- the report ---------------------------------------------------------------------------------------------


def median(samples: list[Sample], attribute: str) -> float:
    return statistics.median(getattr(sample, attribute) for sample in samples)


@dataclass(frozen=True)
class Figures:
    """The medians of one library at one process count."""

    enqueue: float
    drain: float
    end_to_end: float
    worker_cpu_ms: float  # per 1,000 jobs drained
    server_cpu_ms: float
    busy: float
    own_cores: float
    runs: int


def figures(samples: list[Sample]) -> dict[tuple[str, int], Figures]:
    found: dict[tuple[str, int], Figures] = {}
    for key in sorted({(s.library, s.processes) for s in samples}):
        group = [s for s in samples if (s.library, s.processes) == key]
        jobs = group[0].jobs
        found[key] = Figures(
            enqueue=statistics.median(jobs / s.enqueue_s for s in group),
            drain=statistics.median(jobs / s.drain_s for s in group),
            end_to_end=statistics.median(s.end_to_end for s in group),
            worker_cpu_ms=statistics.median(s.worker_cpu_s / jobs * 1e6 for s in group),
            server_cpu_ms=statistics.median(s.server_cpu_s / jobs * 1e6 for s in group),
            busy=statistics.median(s.busy for s in group),
            own_cores=statistics.median(s.own_cores for s in group),
            runs=len(group),
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="jobs a run (default 20,000; 300 with --quick)")
    parser.add_argument("--batch", type=int, default=1_000, help="jobs per enqueue call")
    parser.add_argument("--rounds", type=int, help="runs of each library at each process count (default 3; 1)")
    parser.add_argument("--processes", help="process counts, comma-separated (default 1,2,4; 1,2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 jobs, 1 and 2 processes, no docs")
    parser.add_argument("--libraries", help="which libraries, comma-separated (default: every one installed)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(*args.worker))
        return
    jobs = args.jobs or (300 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 3)
    processes = tuple(int(n) for n in args.processes.split(",")) if args.processes else PROCESSES
    processes = processes if args.processes or not args.quick else (1, 2)
    asked = args.libraries.split(",") if args.libraries else list(LIBRARIES)
    unknown = sorted(set(asked) - set(LIBRARIES))
    if unknown:
        parser.error(f"unknown libraries {unknown}: choose from {sorted(LIBRARIES)}")
    names = [name for name, (module, _factory) in LIBRARIES.items() if name in asked and installed(module)]
    missing = sorted(set(asked) - set(names))
    if "asyncq" not in names:
        raise SystemExit("asyncq's PostgreSQL store needs asyncpg: pip install -e '.[postgres]'")
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (pip install -e '.[peers]')")
    settings = asyncio.run(server_settings())
    if settings.get("fsync") != "on" or settings.get("synchronous_commit") != "on":
        raise SystemExit(
            f"the server is not durable: fsync={settings.get('fsync')}, "
            f"synchronous_commit={settings.get('synchronous_commit')}"
        )
    args.load_before, args.jobs_run, args.rounds_run = load(), jobs, rounds
    samples = asyncio.run(measure(names, processes, jobs, min(args.batch, jobs), rounds))
    partial = args.quick or bool(args.libraries)  # a smoke run, or not every library: no docs
    report(figures(samples), names, processes, settings, args, quick=partial)


HEADERS = [
    "library",
    "processes",
    "enqueue jobs/s",
    "drain jobs/s",
    "end to end jobs/s",
    "worker CPU ms/1k",
    "server CPU ms/1k",
    "CPUs: own / others",
    "runs",
]


def table_rows(found: dict[tuple[str, int], Figures], names: list[str], processes: tuple[int, ...]) -> list[Any]:
    return [
        (
            name,
            count,
            f"{f.enqueue:,.0f}",
            f"{f.drain:,.0f}",
            f"{f.end_to_end:,.0f}",
            f"{f.worker_cpu_ms:,.0f}",
            f"{f.server_cpu_ms:,.0f}",
            f"{f.own_cores:.2f} / {max(0.0, f.busy * CPUS - f.own_cores):.2f}",
            f.runs,
        )
        for name in names
        for count in processes
        for f in [found[(name, count)]]
    ]


def targets(
    found: dict[tuple[str, int], Figures], names: list[str], processes: tuple[int, ...]
) -> list[tuple[str, str, bool]]:
    """Each target: what, the figure, met or not."""
    peers = [name for name in names if name != "asyncq"]
    checks: list[tuple[str, str, bool]] = []
    for count in processes if peers else ():
        ours = found[("asyncq", count)].end_to_end
        best = max(peers, key=lambda name: found[(name, count)].end_to_end)
        theirs = found[(best, count)].end_to_end
        what = f"{count} process(es): asyncq ≥ {TARGET_PEER_RATIO:.0f}× the faster peer end to end ({best})"
        measured = f"{ours / theirs:.2f}× ({ours:,.0f} vs {theirs:,.0f} jobs/s)"
        checks.append((what, measured, ours >= TARGET_PEER_RATIO * theirs))
    one, many = found[("asyncq", processes[0])], found[("asyncq", processes[-1])]
    what = f"asyncq {processes[-1]} processes ≥ {TARGET_SCALING}× {processes[0]} process end to end"
    measured = f"{many.end_to_end / one.end_to_end:.2f}× (drain alone {many.drain / one.drain:.2f}×)"
    checks.append((what, measured, many.end_to_end >= TARGET_SCALING * one.end_to_end))
    return checks


def in_the_way(found: dict[tuple[str, int], Figures], processes: tuple[int, ...], jobs: int) -> str:
    """Why asyncq's processes scale as they do, from the figures: the CPUs it had, and what all of them would give."""
    one, many = found[("asyncq", processes[0])], found[("asyncq", processes[-1])]
    per_job = (many.worker_cpu_ms + many.server_cpu_ms) / 1e6  # CPU seconds a job, at the most processes
    capacity = CPUS / per_job
    best = jobs / (jobs / many.enqueue + jobs / capacity)
    others = max(0.0, many.busy * CPUS - many.own_cores)
    return (
        f"What bounds the scaling is CPU. At {processes[-1]} processes asyncq's drain kept {many.own_cores:.2f} CPUs"
        f" busy with its own work (its workers and their backends) while other work on the machine took"
        f" {others:.2f} of the {CPUS}; at {processes[0]} process, {one.own_cores:.2f} (the worker and the server take"
        f" turns within a group commit). A job costs {many.worker_cpu_ms + many.server_cpu_ms:.0f} µs of CPU at"
        f" {processes[-1]} processes ({many.worker_cpu_ms:.0f} in the worker, {many.server_cpu_ms:.0f} in the server;"
        f" {one.worker_cpu_ms + one.server_cpu_ms:.0f} at {processes[0]}), so all {CPUS} CPUs would drain at most"
        f" {capacity:,.0f} jobs/s, and with this invocation's enqueue (one process in every configuration,"
        f" {many.enqueue:,.0f} jobs/s) end to end would reach at most {best:,.0f} jobs/s:"
        f" {best / one.end_to_end:.2f}× one process."
    )


def report(
    found: dict[tuple[str, int], Figures],
    names: list[str],
    processes: tuple[int, ...],
    settings: dict[str, str],
    args: argparse.Namespace,
    *,
    quick: bool,
) -> None:
    jobs, rows, checks = args.jobs_run, table_rows(found, names, processes), targets(found, names, processes)
    print_table(f"PostgreSQL queues, {jobs:,} jobs, {TASKS} tasks a process (medians)", HEADERS, rows)
    print_table("targets", ["target", "measured", "verdict"], [(w, m, verdict(ok)) for w, m, ok in checks])
    print(in_the_way(found, processes, jobs))
    print(f"load average (1 min): {args.load_before} before, {load()} after")
    if quick:
        return
    versions = ", ".join(f"{name} {version(name)}" for name in names if name != "asyncq")
    command = f"python benchmarks/postgres.py --jobs {jobs} --batch {args.batch} --rounds {args.rounds_run}"
    body = f"""## PostgreSQL: asyncq beside pgqueuer and procrastinate (`postgres`)

`{command}`: PostgreSQL {settings.get("server_version")} on 127.0.0.1 (`fsync` {settings.get("fsync")},
`synchronous_commit` {settings.get("synchronous_commit")} for every database and read back, `wal_sync_method`
{settings.get("wal_sync_method")}), Python {platform.python_version()}, {CPUS} CPUs shared by the server, the
workers, the producer and other work on the machine, {time.strftime("%Y-%m-%d", time.gmtime())}; load average
(1 min) {args.load_before} before, {load()} after. Peers: {versions or "none installed"}.

Each run, in a fresh database: the library's schema; {jobs:,} jobs enqueued from one process in batches of
{args.batch:,} (one call each); then 1, 2 or 4 worker processes, set up and waiting, told to go at once, each with
{TASKS} concurrent no-op `async` handlers, until nothing is left (every job run once and none left unfinished, or
the run is refused). **End to end** = jobs / (enqueue time + drain time). The libraries alternate run by run (the
order rotating), {args.rounds_run} runs each; the figures are medians, the ratios from this one invocation.
**CPU** per 1,000 jobs drained: the worker processes' own, and the server's for their connections. **CPUs** during
the drain: kept busy by the library's own work (its workers and their backends), and by everything else on the
machine (other programs; the producer is idle by then).

{markdown_table(HEADERS, rows)}

| target | measured | verdict |
|:---|---:|---:|
""" + "\n".join(f"| {what} | {measured} | {verdict(ok)} |" for what, measured, ok in checks)
    body += f"\n\n{in_the_way(found, processes, jobs)}\n\nHow each library is driven (its documented API, in the"
    body += " settings its docs give for speed):\n" + PEER_NOTES
    write_section(SECTION, body)


PEER_NOTES = """
- **asyncq**: `Queue.enqueue_many`; `Pool(queue, concurrency=16).run(burst=True)` with its defaults (a group
  commit of up to 128 finishes that also claims the next batch, LISTEN/NOTIFY wake-ups, a pool of 4 connections).
- **pgqueuer**: `Queries.enqueue` with lists (its batch insert); `PgQueuer.from_asyncpg_connection(…).run(mode=
  drain)` on one asyncpg connection a process (the driver its benchmark tool defaults to, and its docs call the
  faster), dequeuing 16 jobs a query; its running jobs are not capped (its default): capped at 16 with
  `max_concurrent_tasks` (which must be two batches, so batches of 8) it drained 30-40 % slower on this machine.
  Its finishes are buffered and written in batches; a finished job is moved to its log table.
- **procrastinate**: `Task.batch_defer_async`; `App.run_worker_async(concurrency=16, wait=False)` on its
  `PsycopgConnector` with a pool of 16 connections; it fetches one job a query and finishes each on its own.
"""


if __name__ == "__main__":
    main()
