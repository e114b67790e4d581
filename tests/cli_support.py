"""Shared by the ``asyncq`` command's tests: run the real command as a subprocess, and build a queue file
with every status and dead reason through ``Queue`` (with a moved clock, so that some jobs are old)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncq.core.clock import wall_clock_ms
from asyncq.queue import Queue

ROOT = Path(__file__).resolve().parents[1]
DAY_MS = 86_400_000


@dataclass
class Clock:
    now: int

    def __call__(self) -> int:
        return self.now


def cli_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "ASYNCQ_DB"}
    return env | {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def run_cli(*args: str, cwd: Path, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python -m asyncq ARGS`` in ``cwd``, its output captured (stdin closed unless given)."""
    return subprocess.run(
        [sys.executable, "-m", "asyncq", *args],
        cwd=cwd,
        env=cli_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_json(*args: str, cwd: Path, stdin: str | None = None) -> Any:
    """Run with ``--json``; the parsed document (the command must succeed)."""
    done = run_cli(*args, "--json", cwd=cwd, stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def fingerprint(path: Path) -> str | None:
    """The file's sha256, or ``None`` if it does not exist."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


async def _finish_one(queue: Queue, job_id: str, outcome: str, **options: Any) -> None:
    await queue.enqueue(job_id, {"job": job_id}, **options)
    [ticket] = await queue.claim("builder")
    assert ticket.id == job_id
    await queue.finish(ticket, outcome)


async def _sweep_past_deadline(queue: Queue, clock: Clock, job_id: str) -> None:
    await queue.enqueue(job_id, {"job": job_id}, ttl=1)
    clock.now += 2000
    assert await queue.claim("sweeper") == []


async def _build(path: Path, now: int) -> None:
    clock = Clock(now - 10 * DAY_MS)
    async with await Queue.open(str(path), clock=clock) as queue:
        for n in (1, 2, 3):
            await _finish_one(queue, f"old-done-{n}", "ok")
        await _finish_one(queue, "old-perm", "permanent")
        await queue.enqueue("old-cancel", {"job": "old-cancel"})
        await queue.cancel("old-cancel", "old-note")
        await _sweep_past_deadline(queue, clock, "old-dl")
        clock.now = now - 60_000
        await _finish_one(queue, "d-1", "ok")
        await _finish_one(queue, "x-perm-1", "permanent")
        await _finish_one(queue, "x-perm-2", "permanent")
        await _finish_one(queue, "x-exh-1", "retry", max_attempts=1)
        await _sweep_past_deadline(queue, clock, "x-dl-1")
        await queue.enqueue("x-cancel", {"job": "x-cancel"})
        await queue.cancel("x-cancel", "not-needed")
        await queue.enqueue("l-1", {"job": "l-1"})
        await queue.claim("worker-a", lease=600)
        for job_id in ("p-1", "p-2"):
            await queue.enqueue(job_id, {"job": job_id, "n": [1, 2]})
        await queue.enqueue("m-1", {"to": "someone"}, queue="mail")


def build_queue(path: Path) -> None:
    """A closed, checkpointed queue file (no -wal) with:

    pending p-1, p-2, m-1 (queue mail); leased l-1 (worker-a, 10 minutes); done old-done-1..3 (10 days ago),
    d-1; dead old-perm, old-cancel, old-dl (10 days ago), x-perm-1, x-perm-2, x-exh-1, x-dl-1, x-cancel."""
    asyncio.run(_build(path, wall_clock_ms()))


EXPECTED_STATUS = {"pending": 3, "leased": 1, "done": 4, "dead": 8}
EXPECTED_DEAD = {"cancelled": 2, "deadline": 2, "exhausted": 1, "permanent": 3}


@contextlib.contextmanager
def holding_write_lock(db: Path) -> Iterator[None]:
    """Another process holds ``db``'s write lock (``BEGIN IMMEDIATE``) inside the block: it has it when the block
    starts, and has released it (and exited) when the block ends."""
    code = (
        "import sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "con.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
        "con.execute('ROLLBACK')\n"
        "con.close()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0


def run_many(commands: list[list[str]], *, cwd: Path, timeout: float = 60) -> list[subprocess.CompletedProcess[str]]:
    """Several ``python -m asyncq`` commands at once (each independent), their results in order."""
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "asyncq", *args],
            cwd=cwd,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    results = []
    for args, process in zip(commands, started, strict=True):
        out, err = process.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(args, process.returncode, out, err))
    return results


def run_on_terminal(*args: str, cwd: Path, stdin: str = "", timeout: float = 30) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (stdout and stdin piped): exit status, stdout, terminal text."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncq", *args],
        cwd=cwd,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    seen = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):  # EIO once the last writer closed the terminal
            while chunk := os.read(master, 4096):
                seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = process.communicate(stdin, timeout=timeout)
        reader.join(timeout)
    finally:
        os.close(master)
    return process.returncode, out, seen.decode(errors="replace")
