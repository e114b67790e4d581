"""Storage faults (issue 19, point 3), the read-only part: a queue file, or its directory, made read-only and then
writable again; what the queue and the command do meanwhile, and whether the side files SQLite created
meanwhile keep the queue broken.

"Read-only" for root: root ignores mode bits only through CAP_DAC_OVERRIDE (and CAP_DAC_READ_SEARCH, CAP_FOWNER),
so these tests start their openers without those capabilities (``fault_support.unprivileged``): the kernel
then checks the mode bits exactly as for the files' owner, an ordinary user. That is what users meet: a
``chmod``, a directory they may not write, side files left by another opener. A read-only bind mount
(``unshare -m``) or ``chattr +i`` would stop root too, but they make a whole file system or one inode
read-only, and SQLite's side files would never be created read-only under them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli_env

from asyncq import JobSpec, Queue
from asyncq.store.sqlite import admin

try:
    import fault_support as support
except ImportError:  # tests/ imported as a package
    from tests import fault_support as support

pytestmark = pytest.mark.timeout(60)

T0 = support.T0
DURABILITIES = ["full", "full-delete"]


def refused_as_read_only(error: list[str] | None) -> bool:
    """The open was refused at once with a ``StoreError`` naming what is read-only and what to do."""
    return error is not None and error[0] == "StoreError" and ("read-only" in error[1] or "not writable" in error[1])


async def _small_queue(path: Path, durability: str) -> None:
    async with await Queue.open(str(path), durability=durability, clock=lambda: T0) as queue:
        await queue.enqueue_many([JobSpec(f"j-{i}", {"n": i, **support.BODY}) for i in range(5)])


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A directory for one queue file whose modes the test changes (restored before cleanup). First it proves
    that the openers the test starts meet the mode bits: else the tests would pass without testing anything."""
    folder = tmp_path / "ro"
    folder.mkdir()
    probe = folder / "probe"
    probe.touch(mode=0o444)
    done = subprocess.run(
        support.unprivileged([sys.executable, "-c", "open('probe', 'a')"]), cwd=folder, capture_output=True, text=True
    )
    probe.unlink()
    if done.returncode == 0 or "PermissionError" not in done.stderr:
        support.skip_or_fail(f"the openers cannot be made to meet the file mode bits here: {done.stderr[-300:]}")
    yield folder
    folder.chmod(0o755)
    for inside in folder.iterdir():
        inside.chmod(0o644)


def open_and_enqueue(folder: Path, durability: str, job: str) -> dict[str, Any]:
    """``Queue.open`` and one enqueue on ``folder/q.db`` in a child that meets the mode bits."""
    config = {"path": "q.db", "durability": durability, "job": job}
    [record] = support.run_child("open-enqueue", config, cwd=folder, drop_root=True)
    return record


def command(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m asyncq ARGS --db q.db`` in ``folder``, meeting the mode bits."""
    argv = support.unprivileged([sys.executable, "-m", "asyncq", *args, "--db", "q.db"])
    return subprocess.run(argv, cwd=folder, env=cli_env(), capture_output=True, text=True, timeout=30)


def assert_one_line_error(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done
    assert done.stderr.startswith("asyncq: error: ") and done.stderr.count("\n") == 1 and text in done.stderr


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_read_only_file_fails_writes_at_once_and_still_reads(folder: Path, durability: str) -> None:
    path = folder / "q.db"
    asyncio.run(_small_queue(path, durability))
    before = support.dump(path)
    path.chmod(0o444)
    record = open_and_enqueue(folder, durability, "new-1")
    assert record["added"] is None and refused_as_read_only(record["error"]), record
    assert record["seconds"] < 1.5, record  # at once, not after the busy timeout (2 s) or a hang
    done = command(folder, "status", "--json")
    assert done.returncode == 0 and '"total": 5' in done.stdout, done
    assert_one_line_error(command(folder, "enqueue", "e-1", "{}"), "read-only")
    path.chmod(0o644)
    assert support.dump(path) == before


@pytest.mark.parametrize("durability", DURABILITIES)
def test_the_queue_works_again_once_the_file_is_writable(folder: Path, durability: str) -> None:
    path = folder / "q.db"
    asyncio.run(_small_queue(path, durability))
    path.chmod(0o444)
    assert refused_as_read_only(open_and_enqueue(folder, durability, "new-1")["error"])
    path.chmod(0o644)
    record = open_and_enqueue(folder, durability, "new-2")
    assert record["added"] is True or "q.db-shm" in record["error"][1], record  # works, or says what to fix
    done = command(folder, "enqueue", "e-1", "{}")
    assert done.returncode == 0 or "q.db-shm" in done.stderr, done.stderr


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_read_only_directory_fails_at_once_and_heals_when_writable(folder: Path, durability: str) -> None:
    path = folder / "q.db"
    asyncio.run(_small_queue(path, durability))
    before = support.dump(path)
    folder.chmod(0o555)  # no -journal, -wal or -shm can be created
    record = open_and_enqueue(folder, durability, "new-1")
    assert record["added"] is None and refused_as_read_only(record["error"]) and record["seconds"] < 1.5, record
    assert record["opened"] is False  # refused at open, with the directory named
    assert_one_line_error(command(folder, "enqueue", "e-1", "{}"), "not writable")
    folder.chmod(0o755)
    assert support.dump(path) == before
    assert open_and_enqueue(folder, durability, "new-1")["added"] is True


@pytest.mark.parametrize("durability", DURABILITIES)
def test_read_commands_read_a_queue_in_a_read_only_directory(folder: Path, durability: str) -> None:
    asyncio.run(_small_queue(folder / "q.db", durability))
    folder.chmod(0o555)
    for args in (["status", "--json"], ["jobs", "--json"]):
        done = command(folder, *args)
        assert done.returncode == 0 and done.stdout.startswith("{"), done.stderr


@pytest.mark.parametrize("made_read_only", ["file", "directory"])
def test_a_read_only_error_names_what_to_fix(folder: Path, made_read_only: str) -> None:
    path = folder / "q.db"
    asyncio.run(_small_queue(path, "full"))
    if made_read_only == "file":
        path.chmod(0o444)
    else:
        folder.chmod(0o555)
    error = open_and_enqueue(folder, "full", "new-1")["error"][1]
    assert ("q.db" if made_read_only == "file" else str(folder)) in error, error


def test_side_files_that_other_openers_create_and_remove_are_never_taken_for_read_only(tmp_path: Path) -> None:
    """The last connection of a WAL file removes -wal and -shm, the next one creates them: a worker opened while
    another process opens and closes the queue (a test's reads, ``asyncq status``) once refused to start because
    it found ``-shm`` absent, then present, and named it read-only. Here a thread opens and closes the file in a
    loop while the open's check runs 20,000 times; the check as it was refused ~50 times in such a run."""
    path = tmp_path / "q.db"
    asyncio.run(_small_queue(path, "full"))
    stop = threading.Event()
    cycles = 0

    def open_and_close() -> None:
        nonlocal cycles
        while not stop.is_set():
            with contextlib.closing(sqlite3.connect(path)) as con:
                con.execute("SELECT count(*) FROM asyncq_jobs").fetchone()
            cycles += 1
            time.sleep(0.0003)

    opener = threading.Thread(target=open_and_close)
    opener.start()
    try:
        refusals = [found for _ in range(20_000) if (found := admin.read_only_part(str(path))) is not None]
    finally:
        stop.set()
        opener.join()
    assert cycles >= 20, "the side files did not come and go while the check ran"
    assert refusals == []
