"""Chaos: worker processes delivering over HTTP to an inbox receiver, under a seeded nemesis; one JSON verdict.

    python benchmarks/chaos.py --seed 1 --jobs 5000 --workers 3 --duration 60
    python benchmarks/chaos.py --store postgresql [--db postgresql://…] --jobs 3000 --duration 30

What happens, all on this machine (docs/reliability.md tells the figures of a long run and a CI-sized one):

1. ``--jobs`` jobs go into a queue file (``--store sqlite``) or a PostgreSQL schema of the run's own
   (``--store postgresql``: on ``--db URL``, else on a cluster the harness starts and removes, ``pg_cluster``),
   each with ``--max-attempts`` attempts, in parts: as each step of the
   nemesis starts (60 %, 30 %, 5 %, 5 %, and one probe job during the last stop), so every fault has work.
2. The project's receiver starts (``python -m asyncq.inbox --effect stock``, its own SQLite file), and
   ``--workers`` worker processes, each an ``asyncq.Pool`` delivering with ``HttpTransport`` + ``deliver_with``
   (``chaos_worker.py``), which record each delivery's start in a shared log before sending it.
3. The nemesis (``chaos_nemesis.py``, seeded by ``--seed``) SIGKILLs a random worker holding leases every
   200-300 ms and restarts it, for 60 % of ``--duration``; then also SIGKILLs and restarts the receiver every
   1-2 s, for the other 40 %; then SIGSTOPs a worker past its lease and resumes it; then SIGSTOPs a worker while
   it holds the store's write lock (on PostgreSQL: a transaction open) (and enqueues the probe job meanwhile)
   and resumes it. On PostgreSQL the two kill phases also end every client backend every 0.5-1 s and
   crash-restart the server once each (``chaos_pg.PostgresServer``; no restart on a ``--db`` server).
4. A quiet drain: no more faults, until no job is pending or leased (``--drain-timeout`` at most); then every
   process gets SIGTERM.
5. The checker (``chaos_check.py``) reads every store through fresh connections and prints one JSON line on
   stdout. The exit code is 1 when lost, duplicated, unexpected or non-terminal is not 0 or a file fails its
   ``integrity_check``.

Workers that exit on their own (a crash, not a kill) are counted with the last line of their stderr and
restarted. Progress goes to stderr; the files stay in ``--dir`` (default: a new temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_check import body_of, check, failed, percentile
from chaos_fleet import Fleet, SelfExit, WorkerOptions
from chaos_nemesis import Nemesis, Plan, RecoveryWatch, Server
from chaos_store import STORES
from chaos_store import started as started_store

from asyncq import JobSpec


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="seeds every choice of the nemesis")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of kills (the stops come after)")
    parser.add_argument("--concurrency", type=int, default=8, help="handler tasks per worker process")
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--max-attempts", type=int, default=3, help="each job's attempts (the CLI's default: 3)")
    parser.add_argument("--stop-past-lease", type=float, help="seconds (default: 2.5 leases)")
    parser.add_argument(
        "--stop-holding-lock",
        type=float,
        default=6.0,
        help="seconds (default 6: past SQLite's 5 s busy timeout; on PostgreSQL a transaction held open)",
    )
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--store", choices=sorted(STORES), default="sqlite")
    parser.add_argument("--db", help="--store postgresql: the server's URL (default: a cluster of the run's own)")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a new temporary folder)")
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.workers < 2:
        parser.error("--jobs and --workers must be at least 2")
    if args.db is not None and args.store != "postgresql":
        parser.error("--db is for --store postgresql")
    return args


def say(message: str, started: float) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {message}", file=sys.stderr, flush=True)


def drain(nemesis: Nemesis, store: Any, timeout: float) -> float | None:
    """Let the workers run with no fault until no job is pending or leased; the seconds it took (``None``
    if ``timeout`` passed first)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        counts = store.counts()
        if counts["pending"] == counts["leased"] == 0:
            return round(time.monotonic() - started, 2)
        nemesis.idle_until(time.monotonic() + 0.1)
    return None


def nemesis_figures(nemesis: Nemesis, fleet: Fleet) -> dict[str, Any]:
    watch = nemesis.watch
    causes = Counter(exit.last_stderr for exit in fleet.self_exits)
    return {
        "kills": nemesis.kills,
        "kills_skipped": nemesis.kills_skipped,
        "receiver_kills": nemesis.receiver_kills,
        "stops": nemesis.stops,
        "self_exits": len(fleet.self_exits),
        "self_exit_causes": dict(causes.most_common()),
        "orphaned_by_kills": watch.orphaned,
        "recovery_ms": {
            "p50": percentile(watch.recovery_ms, 50),
            "p99": percentile(watch.recovery_ms, 99),
            "max": percentile(watch.recovery_ms, 100),
            "reclaimed": len(watch.recovery_ms),
            "swept_dead": watch.swept,
            "unresolved": len(watch.outstanding),
        },
        "enqueue_during_stop": nemesis.probe,
        "backlog": nemesis.backlog,
    }


# The share of the jobs enqueued as each step of the nemesis starts (the probe job aside). The last step needs work
# left while it tries to catch a worker inside a transaction: on a quiet machine 5 % of the jobs drained through
# PostgreSQL before a catch in one run in a few, and the step found no transaction to stop.
SHARES = {"worker_kills": 0.55, "receiver_kills": 0.25, "stop_past_lease": 0.05, "stop_holding_lock": 0.15}


def parts(specs: list[JobSpec]) -> dict[str, list[JobSpec]]:
    """``specs`` cut into consecutive parts by ``SHARES`` (the last step takes the rest)."""
    cut, start, result = list(SHARES), 0, {}
    for step in cut:
        end = len(specs) if step == cut[-1] else start + round(SHARES[step] * len(specs))
        result[step], start = specs[start:end], end
    return result


class Exercised(NamedTuple):
    """What a run leaves for the report."""

    fleet: Fleet
    nemesis: Nemesis
    drained_in: float | None
    ends: list[SelfExit]


def exercise(
    args: argparse.Namespace, folder: Path, store: Any, server: Server | None, specs: list[JobSpec], started: float
) -> Exercised:
    """Start the processes, run the nemesis, drain, stop everything."""
    feeding = parts(specs[:-1])
    options = WorkerOptions(args.store, store.location, folder / "events.log", args.concurrency, args.lease_ms)
    fleet = Fleet(folder, options)
    nemesis = Nemesis(fleet, store, random.Random(args.seed), RecoveryWatch(store))
    nemesis.server, nemesis.server_rng = server, random.Random(args.seed + 1)
    stop_past_lease = 2.5 * args.lease_ms / 1000 if args.stop_past_lease is None else args.stop_past_lease
    plan = Plan(0.6 * args.duration, 0.4 * args.duration, stop_past_lease, args.stop_holding_lock)

    def feed(step: str) -> None:
        asyncio.run(store.enqueue(feeding[step]))
        say(f"{step}: {len(feeding[step])} jobs enqueued; {store.counts()}", started)

    try:
        fleet.start_receiver()
        fleet.start_workers(args.workers)
        nemesis.watch.start()
        nemesis.run(plan, feed, lambda: asyncio.run(store.enqueue(specs[-1:])))
        say(f"nemesis done ({nemesis.kills} kills, {store.counts()}): quiet drain", started)
        drained_in = drain(nemesis, store, args.drain_timeout)
    finally:
        nemesis.watch.stop()
        ends = fleet.stop_all()
        store.close()
    say(f"drained in {drained_in} s; checking", started)
    return Exercised(fleet, nemesis, drained_in, ends)


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The whole run; the report's figures, the headline first."""
    started = time.monotonic()
    ids = [f"job-{n:06d}" for n in range(args.jobs)]
    specs = [JobSpec(job_id, json.loads(body_of(job_id)), max_attempts=args.max_attempts) for job_id in ids]
    with started_store(args.store, folder, args.db) as (store, server):
        fleet, nemesis, drained_in, ends = exercise(args, folder, store, server, specs, started)
        report: dict[str, Any] = {"store": args.store, "seed": args.seed, "jobs": args.jobs, "workers": args.workers}
        report["duration"] = args.duration
        report |= check(store, fleet.inbox, fleet.options.events, set(ids), nemesis.held_at_kills)
        report |= nemesis_figures(nemesis, fleet)
        report |= server.figures() if server is not None else {}
    report["final_exit_codes"] = dict(Counter(str(end.code) for end in ends))
    report["unclean_stops"] = [vars(end) for end in ends if end.code not in (0, -15)]
    report["drain_s"] = drained_in
    report |= {"wall_s": round(time.monotonic() - started, 1), "dir": str(folder)}
    return {key: report[key] for key in HEADLINE if key in report} | report


# The figures the JSON line starts with, in this order (the details follow).
HEADLINE = (
    "jobs",
    "kills",
    "receiver_kills",
    "lost",
    "duplicated",
    "unexpected",
    "non_terminal",
    "redeliveries",
    "stale_finishes_rejected",
    "dead_by_reason",
    "dead_never_started",
    "recovery_ms",
    "integrity",
    "drain_s",
    "self_exits",
    "self_exit_causes",
    "server_restarts",
    "backends_ended",
)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="asyncq-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    report = run(args, folder)
    bad = failed(report)
    report["failed"] = bad
    print(json.dumps(report), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
