"""The main job: fan jobs out to an HTTP receiver with worker processes, kill one, lose nothing.

    python examples/fanout.py              # 20,000 jobs, 2 worker processes (what `make demo` runs)
    python examples/fanout.py --jobs 2000  # smaller

What happens, all on this machine:
1. An inbox receiver starts on 127.0.0.1 (``python -m asyncq.inbox``, its own SQLite file): each POST adds the
   event's ``qty`` to a stock row and records the id, in one durable transaction, before it answers.
2. The jobs are enqueued into a queue file (one transaction per 1,000).
3. Worker processes run ``asyncq.Pool`` with the HTTP transport, each claiming batches under short leases.
4. While at least 30 % of the jobs are still pending, one worker is killed with SIGKILL: its leased jobs are
   neither done nor lost. Their leases expire and the other worker claims them again (a new token each);
   jobs it had already delivered reach the receiver twice, and the inbox absorbs the duplicate. The screen
   says when the kill happens and when the last of its leases has been taken over: until then the progress
   bar may stand still, the jobs it waits for being those leases.
5. A report: enqueued, applied (inbox rows), duplicates absorbed, leases reclaimed, stale finishes, dead.
   The exit code is 1 unless every enqueued job was applied exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asyncq import JobSpec, Pool, Queue, deliver_with
from asyncq.delivery.http import HttpTransport
from asyncq.inbox import spawn as spawn_receiver

LEASE_MS = 2_000


# -- the worker process -------------------------------------------------------------------------------


async def work(db: str, url: str, owner: str, concurrency: int) -> None:
    """Run a pool until the queue has nothing pending or leased; print its counters as JSON."""
    queue = await Queue.open(db)
    transport = HttpTransport(url, timeout=5.0)
    pool = Pool(queue, concurrency=concurrency, owner=owner, lease=LEASE_MS / 1000, poll_max=0.2)
    pool.register("default", deliver_with(transport))

    async def stop_when_drained() -> None:
        while True:
            await asyncio.sleep(0.2)
            stats = await queue.stats()
            if stats.by_status["pending"] == 0 and stats.by_status["leased"] == 0:
                pool.stop()
                return

    watcher = asyncio.create_task(stop_when_drained())
    await pool.run()
    watcher.cancel()
    await transport.close()
    await queue.close()
    print(json.dumps(asdict(pool.counters)), flush=True)


# -- the conductor ------------------------------------------------------------------------------------


def start_worker(db: Path, url: str, owner: str, concurrency: int) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--worker", "--db", str(db), "--url", url, "--owner", owner]
    command += ["--concurrency", str(concurrency)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=child_env())


def child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


async def enqueue_all(db: Path, jobs: int) -> None:
    async with await Queue.open(str(db)) as queue:
        for start in range(0, jobs, 1000):
            batch = [JobSpec(f"job-{n:06d}", {"qty": 1}) for n in range(start, min(start + 1000, jobs))]
            await queue.enqueue_many(batch)


def progress(done: int, total: int, pending: int, started: float, note: str = "") -> None:
    """One line that redraws itself on a terminal; a line per tenth elsewhere."""
    width = 30
    filled = width * done // max(total, 1)
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done:>6}/{total} done, {pending:>6} pending"
    line += f", {time.monotonic() - started:5.1f} s{note}"
    if sys.stdout.isatty():
        line += "\033[K"  # clear what a longer line left behind
    if sys.stdout.isatty():
        print("\r" + line, end="", flush=True)
    elif done * 10 // max(total, 1) != progress.last_tenth:  # type: ignore[attr-defined]
        progress.last_tenth = done * 10 // max(total, 1)  # type: ignore[attr-defined]
        print(line, flush=True)


progress.last_tenth = -1  # type: ignore[attr-defined]


def counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db, timeout=5) as con:
        rows = con.execute("SELECT status, count(*) FROM asyncq_jobs GROUP BY status").fetchall()
    return {status: 0 for status in ("pending", "leased", "done", "dead")} | dict(rows)


def leased_by(db: Path, owner: str) -> set[str]:
    with sqlite3.connect(db, timeout=5) as con:
        rows = con.execute("SELECT id FROM asyncq_jobs WHERE status = 'leased' AND owner = ?", (owner,))
        return {job_id for (job_id,) in rows}


def wait_for_leases(db: Path, owner: str, worker: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Poll until ``owner`` holds a lease (the worker is another process: its file is all there is to watch)."""
    deadline = time.monotonic() + timeout
    while not leased_by(db, owner):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{owner} claimed nothing (exit code {worker.poll()})")
        time.sleep(0.02)


def say(text: str) -> None:
    """A line of its own, below the progress bar (which redraws itself in place on a terminal)."""
    print(("\n" if sys.stdout.isatty() else "") + text, flush=True)


def kill(db: Path, victim: subprocess.Popen[str], done: int) -> set[str]:
    """SIGKILL ``victim``, say so, and return the ids it held leases on when it died."""
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    orphaned = leased_by(db, "worker-1")
    say(
        f"worker 1 killed with SIGKILL at {done:,} jobs done; waiting for its {len(orphaned)} leases to expire"
        f" (up to {LEASE_MS / 1000:g} s), then worker 2 claims them again"
    )
    return orphaned


def watch_and_kill(db: Path, jobs: int, victim: subprocess.Popen[str], started: float) -> set[str]:
    """Draw progress; SIGKILL ``victim`` once it holds leases, a tenth of the jobs are done and ≥ 30 % is still
    pending, and say when its leases have all been claimed again (the bar counts them down meanwhile).
    Returns the ids it held leases on when it died."""
    orphaned: set[str] = set()
    killed_at: float | None = None
    held = 0  # leases of the killed worker not yet claimed again by worker 2
    while True:
        now = counts(db)
        if held and killed_at is not None and not (held := len(leased_by(db, "worker-1"))):
            say(f"worker 1's {len(orphaned)} leases expired; worker 2 claimed them again"
                f" {time.monotonic() - killed_at:.1f} s after the kill")  # fmt: skip
        note = f", {held} leases of killed worker 1 to expire" if held else ""
        progress(now["done"] + now["dead"], jobs, now["pending"], started, note)
        ready = killed_at is None and now["done"] >= jobs // 10 and now["pending"] >= jobs * 3 // 10
        if ready and leased_by(db, "worker-1"):  # a victim still starting up would orphan nothing
            orphaned = kill(db, victim, now["done"])
            killed_at, held = time.monotonic(), len(orphaned)
        if killed_at is not None and not held and now["pending"] == 0 and now["leased"] == 0:
            print()
            return orphaned
        if killed_at is None and now["pending"] < jobs * 3 // 10:
            raise SystemExit("the workers were too fast to kill one with 30 % pending: use more --jobs")
        time.sleep(0.05)  # the conductor's display rate; the workers do not wait on it


def inbox_totals(inbox_db: Path) -> tuple[int, int, int]:
    with sqlite3.connect(inbox_db, timeout=5) as con:
        applied, duplicates = con.execute("SELECT count(*), coalesce(sum(duplicates), 0) FROM asyncq_inbox").fetchone()
        (stock,) = con.execute("SELECT coalesce(sum(qty), 0) FROM stock").fetchone()
    return applied, duplicates, stock


def reclaimed(db: Path, orphaned: set[str]) -> int:
    """Jobs the killed worker held that another worker claimed again (a later token) and finished."""
    with sqlite3.connect(db, timeout=5) as con:
        rows = con.execute("SELECT id, token FROM asyncq_jobs WHERE status = 'done' AND token > 1").fetchall()
    return sum(1 for job_id, _token in rows if job_id in orphaned)


def conduct(jobs: int, concurrency: int, folder: Path) -> int:
    db, inbox_db = folder / "queue.db", folder / "inbox.db"
    receiver, url = spawn_receiver(inbox_db, effect="stock", env=child_env())
    try:
        asyncio.run(enqueue_all(db, jobs))
        started = time.monotonic()
        # The victim first: the other worker starts once it holds leases, so it cannot drain the queue alone
        # while the victim is still starting up (and then the kill would orphan nothing).
        workers = [start_worker(db, url, "worker-1", concurrency)]
        wait_for_leases(db, "worker-1", workers[0])
        workers.append(start_worker(db, url, "worker-2", concurrency))
        orphaned = watch_and_kill(db, jobs, workers[0], started)
        outputs = [worker.communicate(timeout=120)[0] for worker in workers[1:]]
        elapsed = time.monotonic() - started
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.wait(timeout=30)
    stale = sum(json.loads(out.strip().splitlines()[-1])["stale_finishes"] for out in outputs if out.strip())
    applied, duplicates, stock = inbox_totals(inbox_db)
    final = counts(db)
    report = {
        "enqueued": jobs,
        "applied (inbox rows)": applied,
        "stock (sum of qty)": stock,
        "duplicate deliveries absorbed": duplicates,
        "leases reclaimed after the kill": reclaimed(db, orphaned),
        "stale finishes rejected": stale,
        "dead": final["dead"],
        "wall time (s)": round(elapsed, 2),
        "jobs/s": round(jobs / elapsed),
    }
    width = max(map(len, report))
    for name, value in report.items():
        print(f"{name:<{width}}  {value}")
    print(f"files: {db}  {inbox_db}")
    ok = applied == jobs and stock == jobs and final["done"] == jobs
    print("every job applied exactly once" if ok else "MISMATCH: applied != enqueued")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32, help="handler tasks per worker process")
    parser.add_argument("--dir", type=Path, help="where the SQLite files go (default: a new temp folder)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--owner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(work(args.db, args.url, args.owner, args.concurrency))
        return 0
    folder = args.dir or Path(tempfile.mkdtemp(prefix="asyncq-fanout-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"fan-out of {args.jobs} jobs to an inbox receiver, 2 worker processes, one killed with SIGKILL")
    return conduct(args.jobs, args.concurrency, folder)


if __name__ == "__main__":
    sys.exit(main())
