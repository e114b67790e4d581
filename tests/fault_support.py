"""Shared by the storage fault tests and their children (``fault_children.py``): run a child, read a file's rows
through a fresh connection, check a batch writer's file after a kill, and read a child's lines with a deadline.
Only the standard library: the children import it before anything else."""

from __future__ import annotations

import hashlib
import json
import os
import select
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILDREN = Path(__file__).resolve().parent / "fault_children.py"
T0 = 1_700_000_000_000
BODY = {"pad": "x" * 200}
BATCH = 60  # jobs in each of the batch writer's transactions


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``, or fail under ``CI=true``, where a test must never pass by skipping."""
    import pytest  # here: the children import this module, and need no pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def sha256(path: Path) -> str:
    """The file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the repository root first on ``PYTHONPATH`` (and ``extra``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.pop("ASYNCQ_DB", None)
    return env | extra


def unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run so that the file mode bits apply to it: as root, through the ``unprivileged`` trampoline."""
    return [sys.executable, "-S", str(CHILDREN), "unprivileged", *argv] if os.geteuid() == 0 else argv


def run_child(
    mode: str, config: dict[str, Any], *, cwd: Path, env: dict[str, str] | None = None, drop_root: bool = False
) -> list[dict[str, Any]]:
    """Run one child to its end (60 s at most) and return its JSON lines; it must exit 0."""
    argv = [sys.executable, str(CHILDREN), mode, json.dumps(config)]
    done = subprocess.run(
        unprivileged(argv) if drop_root else argv,
        cwd=cwd,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"child {mode} exited {done.returncode}: {done.stderr[-2000:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


def dump(path: str | Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every row of the jobs and audit tables, in order, through a fresh connection (which, as any opener
    does, rolls a hot journal back first)."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        jobs = con.execute("SELECT * FROM asyncq_jobs ORDER BY seq").fetchall()
        audit = con.execute("SELECT * FROM asyncq_audit ORDER BY seq").fetchall()
    finally:
        con.close()
    return jobs, audit


def integrity(path: str | Path) -> str:
    """``PRAGMA integrity_check`` of the file through a fresh connection: ``ok``, or what SQLite found."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        return "; ".join(str(row[0]) for row in con.execute("PRAGMA integrity_check"))
    finally:
        con.close()


def write_lock_free(path: str | Path) -> bool:
    """Whether another connection can take the write lock at once: nobody holds a transaction open."""
    con = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


class Lines:
    """The JSON lines a child writes to a pipe, each read with a deadline (a silent child fails the test)."""

    def __init__(self, stream: Any) -> None:
        self._fd = stream.fileno()
        self._buffer = b""

    def next(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next line, parsed; ``TimeoutError`` after ``timeout`` seconds, ``EOFError`` at the end."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                raise TimeoutError(f"no line from the child in {timeout} s (so far: {self._buffer[-200:]!r})")
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise EOFError(f"the child closed its output (so far: {self._buffer[-200:]!r})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        parsed: dict[str, Any] = json.loads(line)
        return parsed


def new_batch_file(path: Path) -> Path:
    """An empty DELETE-journal file with the batch writer's own table (asyncq's come with its first open)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("CREATE TABLE batches (n INTEGER PRIMARY KEY)")
    con.close()
    return path


def check_batches(path: Path, events: list[dict[str, Any]]) -> Counter[str]:
    """After a batch writer was killed: the file is whole and every transaction in it all or nothing (each batch
    row has its ``BATCH`` jobs, all in one status; no job without its row), everything the writer saw commit
    is there, and what the step in flight at the kill left. Reopening rolls a hot journal back first."""
    journal = Path(f"{path}-journal")
    seen = Counter({"journal left": int(journal.exists() and journal.stat().st_size > 0)})
    assert integrity(path) == "ok"
    con = sqlite3.connect(path, isolation_level=None)
    try:
        batches = {n for (n,) in con.execute("SELECT n FROM batches")}
        jobs = con.execute("SELECT id, status FROM asyncq_jobs").fetchall() if batches else []
    finally:
        con.close()
    statuses: dict[int, Counter[str]] = defaultdict(Counter)
    for job_id, status in jobs:
        statuses[int(job_id[1:].split("-")[0])][status] += 1
    assert set(statuses) == batches, "jobs without their batch row, or a row without its jobs"
    assert all(len(found) == 1 and sum(found.values()) == BATCH for found in statuses.values()), statuses
    for event in events:
        if event.get("commit") == "enqueue":
            assert event["batch"] in batches, event
        elif event.get("commit") in ("claim", "finish"):
            wanted = ("leased", "done") if event["commit"] == "claim" else ("done",)
            assert all(next(iter(statuses[n])) in wanted for n in event["batches"]), (event, statuses)
    last = events[-1]
    if "begin" in last:
        seen[f"killed in {last['begin']}"] += 1
        if last["begin"] == "enqueue":
            seen["enqueue landed" if last["batch"] in batches else "enqueue rolled back"] += 1
    return seen
