"""Storage faults (issue 19, point 3): a full disk both ways, an I/O error at every write of each transition,
damaged files, a hot journal after SIGKILLs mid-COMMIT, and a file or directory made read-only and writable again.

"Read-only" for root: root ignores mode bits only through CAP_DAC_OVERRIDE (and CAP_DAC_READ_SEARCH, CAP_FOWNER),
so the read-only tests run their openers without those capabilities (``fault_children.unprivileged``): the
kernel then checks the mode bits exactly as for the files' owner, an ordinary user. A read-only bind mount
(``unshare -m``) or ``chattr +i`` would also stop root, but they make a file system or an inode read-only,
where what users meet is ``chmod`` and a file created by another user.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli_env, run_cli

from asyncq import JobSpec, Queue, enqueue_sync
from asyncq.lab.lease import open_queue

try:
    import fault_children as kids
except ImportError:  # tests/ imported as a package
    from tests import fault_children as kids

pytestmark = pytest.mark.timeout(90)

T0 = kids.T0
DURABILITIES = ["full", "full-delete"]
SHIM_SOURCE = Path(__file__).resolve().parent / "faultshim" / "faultshim.c"
SQLITE_REFUSALS = ("file is not a database", "database disk image is malformed")
KILLS = int(os.environ.get("ASYNCQ_FAULT_KILLS", "200"))  # the hot-journal test's SIGKILLs (CI size: 200)


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``, or fail under ``CI=true``, where a test must never pass by skipping."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def pragma(queue: Queue, text: str) -> Any:
    """Run ``PRAGMA text`` on the queue's own connection (its public transaction runs the app's SQL there)."""
    async with queue.transaction() as tx:
        rows = await tx.execute(f"PRAGMA {text}")
    return rows[0][0] if rows else None


# --- 1. a full disk ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_file_size_limit_fails_the_write_keeps_the_rows_and_lifts(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "q.db"
    [record] = kids.run_child("fsize", {"path": str(path), "durability": durability}, cwd=tmp_path)
    kind, message, code = record["error"]
    # A page written wholly past the limit is EFBIG, which SQLite reports as an I/O error; a write that
    # straddles it is short, which it reports as a full disk. Either way it surfaces as it is.
    assert (kind, message, code) in [
        ("OperationalError", "disk I/O error", "SQLITE_IOERR_WRITE"),
        ("OperationalError", "database or disk is full", "SQLITE_FULL"),
    ]
    assert record["acked"] >= 1 and record["unchanged"] and record["lock_free"]
    assert record["retried"] is True
    assert kids.integrity(path) == "ok"
    ids = {row[1] for row in kids.dump(path)[0]}
    assert ids == {f"seed-{i}" for i in range(20)} | {f"j-{i}" for i in range(record["acked"] + 1)}


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_max_page_count_on_the_queues_own_connection(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "q.db"
    body = {"pad": "z" * 1500}
    async with await Queue.open(str(path), durability=durability, clock=lambda: T0) as queue:
        await queue.enqueue_many([JobSpec(f"seed-{i}", body) for i in range(10)])
        cap = await pragma(queue, "page_count") + 4
        assert await pragma(queue, f"max_page_count = {cap}") == cap
        other = sqlite3.connect(path)
        assert other.execute("PRAGMA max_page_count").fetchone()[0] != cap  # per connection: the queue's only
        other.close()
        added, error = 0, None
        while error is None and added < 1000:
            before = kids.dump(path)
            try:
                await queue.enqueue(f"j-{added}", body)
                added += 1
            except sqlite3.OperationalError as exc:
                error = exc
        assert error is not None and str(error) == "database or disk is full"
        assert error.sqlite_errorname == "SQLITE_FULL"
        assert kids.dump(path) == before and kids.write_lock_free(path)
        batch = [JobSpec(f"batch-{i}", body) for i in range(8)]
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            await queue.enqueue_many(batch)
        assert kids.dump(path) == before and kids.write_lock_free(path)
        await pragma(queue, "max_page_count = 1073741823")
        assert await queue.enqueue(f"j-{added}", body) is True
        assert await queue.enqueue_many(batch) == [True] * 8
    assert kids.integrity(path) == "ok"
    assert len(kids.dump(path)[0]) == 10 + added + 1 + 8


def test_max_page_count_fails_enqueue_sync_in_its_own_and_the_callers_transaction(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)")
    body = {"pad": "z" * 1500}
    for i in range(10):
        assert enqueue_sync(con, f"seed-{i}", body, now_ms=T0) is True
    con.execute(f"PRAGMA max_page_count = {con.execute('PRAGMA page_count').fetchone()[0] + 3}")
    added, error = 0, None
    while error is None and added < 1000:
        before = kids.dump(path)
        try:
            enqueue_sync(con, f"j-{added}", body, now_ms=T0)
            added += 1
        except sqlite3.OperationalError as exc:
            error = exc
    assert error is not None and error.sqlite_errorname == "SQLITE_FULL" and not con.in_transaction
    assert kids.dump(path) == before and kids.write_lock_free(path)
    con.execute("BEGIN IMMEDIATE")  # the app's order and its job, together
    con.execute("INSERT INTO orders (note) VALUES (?)", ("x" * 100,))
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        enqueue_sync(con, f"j-{added}", body, now_ms=T0)
    if con.in_transaction:  # SQLite may have rolled the whole transaction back by itself
        con.execute("ROLLBACK")
    assert kids.dump(path) == before and con.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    con.execute("PRAGMA max_page_count = 1073741823")
    assert enqueue_sync(con, f"j-{added}", body, now_ms=T0) is True
    con.close()
    assert kids.integrity(path) == "ok" and len(kids.dump(path)[0]) == 10 + added + 1


# --- 2. an I/O error at the k-th write -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``faultshim.c`` built with the machine's gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is missing: the I/O-error shim (tests/faultshim/faultshim.c) cannot be built")
    built = tmp_path_factory.mktemp("faultshim") / "faultshim.so"
    command = [str(gcc), "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(built), str(SHIM_SOURCE)]
    done = subprocess.run([*command, "-ldl"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return built


@pytest.mark.parametrize("sticky", [False, True], ids=["one-bad-write", "disk-gone-then-crash"])
@pytest.mark.parametrize("durability", DURABILITIES)
def test_an_io_error_at_every_write_of_each_transition(
    tmp_path: Path, shim: Path, durability: str, sticky: bool
) -> None:
    config = {"dir": str(tmp_path), "durability": durability, "sticky": sticky}
    env = kids.child_env(LD_PRELOAD=str(shim), FAULTSHIM=str(shim))
    records = kids.run_child("inject", config, cwd=tmp_path, env=env)
    before = kids.dump(tmp_path / "base.db")
    writes, seen = {}, Counter[str]()
    for name in {record["transition"] for record in records}:
        *faulted, clean = [record for record in records if record["transition"] == name]
        assert clean["failed"] == 0 and clean["error"] is None and len(faulted) == clean["k"] - 1 >= 1, clean
        after = kids.dump(clean["path"])
        assert after != before, name
        writes[name] = len(faulted)
        for record in faulted:
            assert record["failed"] >= 1, record
            seen["journal left"] += os.path.exists(record["path"] + "-journal")
            assert kids.integrity(record["path"]) == "ok", record
            state = kids.dump(record["path"])  # after the reopen: a hot journal or torn WAL is resolved
            if record["error"] is None:  # the call said it happened: then it did
                assert state == after, record
            else:
                assert record["error"][:2] == ["OperationalError", "disk I/O error"], record
                assert state in (before, after), record  # whole or not at all, never partly
                seen["landed despite the error" if state == after else "rolled back"] += 1
            if not sticky:
                assert record["lock_free"] and record["usable"], record
        assert kids.dump(faulted[0]["path"]) == before  # the first write failing: nothing happened
    assert len(writes) == 8
    if sticky and durability == "full-delete":
        assert seen["journal left"] > 0  # the crashes left hot journals, which the reopen rolled back
    print(f"writes per transition ({durability}, sticky={sticky}): {dict(sorted(writes.items()))}; {dict(seen)}")


# --- 3. damaged files --------------------------------------------------------------------------------------

DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated-half": lambda good: good[: len(good) // 2],
    "truncated-mid-page": lambda good: good[: len(good) // 2 + 100],
    "truncated-in-header": lambda good: good[:50],
    "garbage": lambda good: random.Random(19).randbytes(len(good)),
    "bad-magic": lambda good: b"SQLite format 4\0" + good[16:],
    "bad-page-size": lambda good: good[:16] + b"\x03\x00" + good[18:],
}


async def _queue_file(path: Path) -> None:
    async with await Queue.open(str(path), clock=lambda: T0) as queue:
        await queue.enqueue_many([JobSpec(f"j-{i}", {"n": i, **kids.BODY}) for i in range(200)])


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A closed WAL queue file of 200 jobs, as bytes."""
    path = tmp_path_factory.mktemp("good") / "q.db"
    asyncio.run(_queue_file(path))
    return path.read_bytes()


def _open_with_queue(path: Path) -> None:
    async def open_and_close() -> None:
        await (await Queue.open(str(path))).close()

    asyncio.run(open_and_close())


def _enqueue_sync_on(path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        enqueue_sync(con, "x-1", {"n": 1})
    finally:
        con.close()


OPENERS = {"Queue.open": _open_with_queue, "open_queue": lambda path: open_queue(path).close()}
OPENERS["enqueue_sync"] = _enqueue_sync_on


def assert_untouched(folder: Path, path: Path, digest: str) -> None:
    """The file's bytes are as they were; SQLite may leave its empty side files, nothing else."""
    assert sha256(path) == digest
    for side in folder.iterdir():
        assert side == path or (side.name in (f"{path.name}-wal", f"{path.name}-shm") and side.stat().st_size in (0, 32768)), side


@pytest.mark.parametrize("opener", OPENERS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_openers_refuse_a_damaged_file_and_leave_it(tmp_path: Path, good_bytes: bytes, damage: str, opener: str) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(DAMAGE[damage](good_bytes))
    digest = sha256(path)
    with pytest.raises(sqlite3.DatabaseError) as refused:
        OPENERS[opener](path)
    assert str(refused.value) in SQLITE_REFUSALS
    assert_untouched(tmp_path, path, digest)


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_command_refuses_a_damaged_file_on_one_line(tmp_path: Path, good_bytes: bytes, damage: str) -> None:
    for command in (["status"], ["init"], ["enqueue", "e-1", "{}"]):
        folder = tmp_path / command[0]
        folder.mkdir()
        path = folder / "q.db"
        path.write_bytes(DAMAGE[damage](good_bytes))
        digest = sha256(path)
        done = run_cli(*command, "--db", "q.db", cwd=folder)
        assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done
        assert done.stderr.startswith("asyncq: error: q.db ") and done.stderr.count("\n") == 1, done.stderr
        assert any(text in done.stderr for text in SQLITE_REFUSALS), done.stderr
        assert_untouched(folder, path, digest)
