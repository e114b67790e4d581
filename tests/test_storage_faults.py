"""Storage faults (issue 19, point 3): a full disk both ways, an I/O error at every write of each transition,
damaged files, and a hot journal after SIGKILLs mid-COMMIT. The read-only file and directory are in
``test_storage_faults_readonly.py``; the children in ``fault_children.py``, the I/O-error shim in ``faultshim/``.
"""

from __future__ import annotations

import asyncio
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
from cli_support import run_cli

from asyncq import JobSpec, Queue, enqueue_sync
from asyncq.lab.lease import open_queue

try:
    import fault_support as support
except ImportError:  # tests/ imported as a package
    from tests import fault_support as support

pytestmark = pytest.mark.timeout(90)

T0 = support.T0
DURABILITIES = ["full", "full-delete"]
SHIM_SOURCE = Path(__file__).resolve().parent / "faultshim" / "faultshim.c"
SQLITE_REFUSALS = ("file is not a database", "database disk image is malformed")
KILLS = int(os.environ.get("ASYNCQ_FAULT_KILLS", "200"))  # the hot-journal test's SIGKILLs (CI size: 200)


async def pragma(queue: Queue, text: str) -> Any:
    """Run ``PRAGMA text`` on the queue's own connection (its public transaction runs the app's SQL there)."""
    async with queue.transaction() as tx:
        rows = await tx.execute(f"PRAGMA {text}")
    return rows[0][0] if rows else None


# --- 1. a full disk ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_file_size_limit_fails_the_write_keeps_the_rows_and_lifts(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "q.db"
    [record] = support.run_child("fsize", {"path": str(path), "durability": durability}, cwd=tmp_path)
    kind, message, code = record["error"]
    # A page written wholly past the limit is EFBIG, which SQLite reports as an I/O error; a write that
    # straddles it is short, which it reports as a full disk. Either way it surfaces as it is.
    assert (kind, message, code) in [
        ("OperationalError", "disk I/O error", "SQLITE_IOERR_WRITE"),
        ("OperationalError", "database or disk is full", "SQLITE_FULL"),
    ]
    assert record["acked"] >= 1 and record["unchanged"] and record["lock_free"]
    assert record["retried"] is True
    assert support.integrity(path) == "ok"
    ids = {row[1] for row in support.dump(path)[0]}
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
            before = support.dump(path)
            try:
                await queue.enqueue(f"j-{added}", body)
                added += 1
            except sqlite3.OperationalError as exc:
                error = exc
        assert error is not None and str(error) == "database or disk is full"
        assert error.sqlite_errorname == "SQLITE_FULL"
        assert support.dump(path) == before and support.write_lock_free(path)
        batch = [JobSpec(f"batch-{i}", body) for i in range(8)]
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            await queue.enqueue_many(batch)
        assert support.dump(path) == before and support.write_lock_free(path)
        await pragma(queue, "max_page_count = 1073741823")
        assert await queue.enqueue(f"j-{added}", body) is True
        assert await queue.enqueue_many(batch) == [True] * 8
    assert support.integrity(path) == "ok"
    assert len(support.dump(path)[0]) == 10 + added + 1 + 8


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
        before = support.dump(path)
        try:
            enqueue_sync(con, f"j-{added}", body, now_ms=T0)
            added += 1
        except sqlite3.OperationalError as exc:
            error = exc
    assert error is not None and error.sqlite_errorname == "SQLITE_FULL" and not con.in_transaction
    assert support.dump(path) == before and support.write_lock_free(path)
    con.execute("BEGIN IMMEDIATE")  # the app's order and its job, together
    con.execute("INSERT INTO orders (note) VALUES (?)", ("x" * 100,))
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        enqueue_sync(con, f"j-{added}", body, now_ms=T0)
    if con.in_transaction:  # SQLite may have rolled the whole transaction back by itself
        con.execute("ROLLBACK")
    assert support.dump(path) == before and con.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    con.execute("PRAGMA max_page_count = 1073741823")
    assert enqueue_sync(con, f"j-{added}", body, now_ms=T0) is True
    con.close()
    assert support.integrity(path) == "ok" and len(support.dump(path)[0]) == 10 + added + 1


# --- 2. an I/O error at the k-th write -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``faultshim.c`` built with the machine's gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        support.skip_or_fail("gcc is missing: the I/O-error shim (tests/faultshim/faultshim.c) cannot be built")
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
    env = support.child_env(LD_PRELOAD=str(shim), FAULTSHIM=str(shim))
    records = support.run_child("inject", config, cwd=tmp_path, env=env)
    before = support.dump(tmp_path / "base.db")
    writes, seen = {}, Counter[str]()
    for name in {record["transition"] for record in records}:
        *faulted, clean = [record for record in records if record["transition"] == name]
        assert clean["failed"] == 0 and clean["error"] is None and len(faulted) == clean["k"] - 1 >= 1, clean
        after = support.dump(clean["path"])
        assert after != before, name
        writes[name] = len(faulted)
        for record in faulted:
            assert record["failed"] >= 1, record
            seen["journal left"] += os.path.exists(record["path"] + "-journal")
            assert support.integrity(record["path"]) == "ok", record
            state = support.dump(record["path"])  # after the reopen: a hot journal or torn WAL is resolved
            assert not os.path.exists(record["path"] + "-journal"), record  # rolled back and gone
            if record["error"] is None:  # the call said it happened: then it did
                assert state == after, record
            else:
                assert record["error"][:2] == ["OperationalError", "disk I/O error"], record
                assert state in (before, after), record  # whole or not at all, never partly
                seen["landed despite the error" if state == after else "rolled back"] += 1
            if not sticky:
                assert record["lock_free"] and record["usable"], record
        assert support.dump(faulted[0]["path"]) == before  # the first write failing: nothing happened
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
        await queue.enqueue_many([JobSpec(f"j-{i}", {"n": i, **support.BODY}) for i in range(200)])


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
    assert support.sha256(path) == digest
    for side in folder.iterdir():
        assert side == path or (
            side.name in (f"{path.name}-wal", f"{path.name}-shm") and side.stat().st_size in (0, 32768)
        ), side


@pytest.mark.parametrize("opener", OPENERS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_openers_refuse_a_damaged_file_and_leave_it(
    tmp_path: Path, good_bytes: bytes, damage: str, opener: str
) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(DAMAGE[damage](good_bytes))
    digest = support.sha256(path)
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
        digest = support.sha256(path)
        done = run_cli(*command, "--db", "q.db", cwd=folder)
        assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done
        assert done.stderr.startswith("asyncq: error: q.db ") and done.stderr.count("\n") == 1, done.stderr
        assert any(text in done.stderr for text in SQLITE_REFUSALS), done.stderr
        assert_untouched(folder, path, digest)


@pytest.mark.parametrize("opener", OPENERS)
def test_a_zero_byte_file_is_an_empty_database_that_the_openers_make_a_queue(tmp_path: Path, opener: str) -> None:
    path = tmp_path / "q.db"
    path.touch()  # SQLite reads an empty file as a database with no tables: creating them is what openers do
    OPENERS[opener](path)
    con = sqlite3.connect(path)
    tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    assert ("jobs" if opener == "open_queue" else "asyncq_jobs") in tables
    assert support.integrity(path) == "ok"


def test_the_command_says_a_zero_byte_file_is_not_a_queue_and_only_init_makes_one(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.touch()
    for command in (["status"], ["jobs"], ["enqueue", "e-1", "{}"]):
        done = run_cli(*command, "--db", "q.db", cwd=tmp_path)
        assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done
        assert (
            done.stderr
            == "asyncq: error: q.db is not an asyncq queue (it has no queue tables; `asyncq init` adds them)\n"
        )
        assert path.stat().st_size == 0 and [p.name for p in tmp_path.iterdir()] == ["q.db"]
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    assert run_cli("status", "--db", "q.db", cwd=tmp_path).returncode == 0


# --- 4. a hot journal after SIGKILL mid-COMMIT -------------------------------------------------------------

KILL_WINDOW_S = 0.05  # about two of the writer's enqueue-claim-finish rounds here (about 25 ms each)


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The batch writers' fork server (``fault_children.zygote``); stopped with its stdin closed."""
    with open(tmp_path / "zygote.stderr", "wb") as errors:
        process = subprocess.Popen(
            [sys.executable, str(support.CHILDREN), "zygote"],
            cwd=tmp_path,
            env=support.child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
    yield process
    assert process.stdin is not None
    process.stdin.close()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def kill_one_writer(zygote: subprocess.Popen[bytes], lines: support.Lines, path: Path, delay: float) -> list[Any]:
    """Fork a writer on ``path``, SIGKILL it ``delay`` seconds after its first transaction began; its events."""
    assert zygote.stdin is not None
    zygote.stdin.write(f"{path}\n".encode())
    zygote.stdin.flush()
    pid = lines.next()["pid"]
    events = [lines.next()]
    assert "begin" in events[0], events
    time.sleep(delay)  # the moment of the kill, drawn at random: this waits for nothing
    os.kill(pid, signal.SIGKILL)
    while "exit" not in (event := lines.next()):
        events.append(event)
    assert event["exit"] == pid and os.WIFSIGNALED(event["status"]), (event, events)
    assert os.WTERMSIG(event["status"]) == signal.SIGKILL, (event, events)
    return events


@pytest.mark.timeout(120)
def test_a_hot_journal_after_sigkill_mid_commit_is_rolled_back_whole(
    tmp_path: Path, zygote: subprocess.Popen[bytes]
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed} (kills {KILLS})")
    rng, lines = random.Random(seed), support.Lines(zygote.stdout)
    seen = Counter[str]()
    for kill in range(KILLS):
        if kill % 50 == 0:  # a new file every 50 kills keeps each integrity_check short
            path = support.new_batch_file(tmp_path / f"batches-{kill // 50}.db")
        events = kill_one_writer(zygote, lines, path, rng.uniform(0, KILL_WINDOW_S))
        seen += support.check_batches(path, events)
    print(dict(seen))
    assert seen["journal left"] > 0 and seen["enqueue rolled back"] > 0  # kills did land inside transactions
