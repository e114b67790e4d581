"""Cross-process wake-ups (``asyncq.store.sqlite.wakeup``): a pool whose poll is a minute away starts a job that a
real child process enqueued, so the wake-up came from the watcher; one watcher per file, stopped with the last
queue on it; a source that fails is logged, counted and replaced, down to the poll.

Nothing here times anything: the timeouts are far below the pools' poll and far above a wake-up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import eventually

from asyncq.queue import Queue
from asyncq.store.sqlite import inotify, timerfd, wakeup
from asyncq.worker.pool import JobContext, Pool

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
LONG_POLL = 60.0  # an idle pool's poll in these tests: a job started well before it was not found by polling
SOON = 20.0  # what "soon" is given here (a wake-up takes milliseconds)
ENQUEUE = """
import asyncio, sys
from asyncq.queue import Queue

async def main() -> None:
    async with await Queue.open(sys.argv[1], durability=None) as queue:
        await queue.enqueue(sys.argv[2], {"from": "child"})

asyncio.run(main())
"""

needs_inotify = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux's")


@pytest.fixture(autouse=True)
def default_sources() -> Iterator[None]:
    previous = wakeup.use_sources(*wakeup.SOURCES)
    yield
    wakeup.use_sources(*previous)


async def enqueue_from_child(path: Path, job_id: str) -> None:
    """Enqueue ``job_id`` from a child process with a queue of its own on ``path``."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENQUEUE, str(path), job_id, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        async with asyncio.timeout(SOON):
            assert await child.wait() == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


def waiting_watcher(path: Path) -> Callable[[], wakeup.Watcher | None]:
    def find() -> wakeup.Watcher | None:
        watcher = wakeup.watching(str(path), asyncio.get_running_loop())
        return watcher if watcher is not None and watcher.waiting else None

    return find


class Started:
    """A pool handler that records the ids it started and sets an event for each."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.event = asyncio.Event()

    async def __call__(self, body: Any, context: JobContext) -> None:
        self.ids.append(context.id)
        self.event.set()


def long_polling_pool(queue: Queue, handler: Started, poll: float = LONG_POLL) -> Pool:
    pool = Pool(queue, concurrency=2, poll_min=poll, poll_max=poll)
    pool.register("default", handler)
    return pool


def inotify_descriptors() -> int:
    """This process's open inotify descriptors (listing ``/proc/self/fd`` opens one that is gone when read)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify"
        except FileNotFoundError:
            continue
    return count


@pytest.mark.parametrize(
    ("durability", "source"),
    [
        pytest.param("full", "inotify", marks=needs_inotify),
        pytest.param("full-delete", "inotify", marks=needs_inotify),
        ("full", "data_version"),
        ("full-delete", "data_version"),
    ],
)
async def test_a_job_enqueued_by_another_process_starts_long_before_the_pools_poll(
    tmp_path: Path, durability: str, source: str
) -> None:
    wakeup.use_sources(source, wakeup.POLL)
    path = tmp_path / "queue.db"
    started = Started()
    async with await Queue.open(path, durability=durability) as queue:
        pool = long_polling_pool(queue, started)
        running = asyncio.create_task(pool.run())
        try:
            watcher = await eventually(waiting_watcher(path), "the idle pool waiting on the watcher", timeout=SOON)
            assert watcher.source == source
            wakeups = wakeup.COUNTERS.wakeups
            await enqueue_from_child(path, "from-child")
            async with asyncio.timeout(SOON):
                await started.event.wait()
        finally:
            pool.stop()
            await running
        assert started.ids == ["from-child"]
        assert wakeup.COUNTERS.wakeups > wakeups
        job = await queue.get("from-child")
        assert job is not None and job.status == "done"


@needs_inotify
async def test_one_watcher_per_file_started_by_the_first_wait_and_stopped_with_the_last_queue(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    threads, descriptors = set(threading.enumerate()), inotify_descriptors()
    started, stopped = wakeup.COUNTERS.started, wakeup.COUNTERS.stopped
    first, second = await Queue.open(path), await Queue.open(path)
    assert wakeup.watching(str(path), asyncio.get_running_loop()) is None  # nothing waits yet: nothing started
    await first.wait_for_rows(0.001)
    await second.wait_for_rows(0.001)
    watcher = wakeup.watching(str(path), asyncio.get_running_loop())
    assert watcher is not None and watcher.source == "inotify" and not watcher.closed
    assert wakeup.COUNTERS.started == started + 1  # both queues share it
    assert inotify_descriptors() == descriptors + 1
    await first.close()
    assert wakeup.watching(str(path), asyncio.get_running_loop()) is watcher and not watcher.closed
    await second.close()
    assert watcher.closed and watcher.source == "poll"
    assert wakeup.COUNTERS.stopped == stopped + 1
    assert wakeup.watching(str(path), asyncio.get_running_loop()) is None
    assert inotify_descriptors() == descriptors
    # No thread of its own; the queues' connection threads have ended when their close returns.
    assert set(threading.enumerate()) <= threads
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert not Path(f"{path}-wal").exists()  # the queue's connection, not the watcher's, closed the file last


@pytest.mark.parametrize(
    ("order", "fallback"),
    [
        pytest.param(("inotify", "data_version", "poll"), "data_version", marks=needs_inotify),
        pytest.param(("inotify", "poll"), "poll", marks=needs_inotify),
    ],
)
async def test_a_source_that_fails_is_logged_counted_and_the_next_one_takes_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, order: tuple[str, ...], fallback: str
) -> None:
    wakeup.use_sources(*order)
    path = tmp_path / "queue.db"
    started = Started()
    poll = LONG_POLL if fallback != "poll" else 0.2  # only the pool's poll finds the job once both sources are gone
    async with await Queue.open(path) as queue:
        pool = long_polling_pool(queue, started, poll)
        running = asyncio.create_task(pool.run())
        try:
            watcher = await eventually(waiting_watcher(path), "the idle pool waiting on the watcher", timeout=SOON)
            assert watcher.source == order[0]
            failures = wakeup.COUNTERS.failures
            assert watcher._write_lock is not None
            watcher._write_lock._con.close()  # its connection dies under it, as a failing disk would leave it
            await enqueue_from_child(path, "from-child")  # the child's write is reported: the next probe fails
            async with asyncio.timeout(SOON):
                await started.event.wait()
            assert watcher.source == fallback
        finally:
            pool.stop()
            await running
    assert started.ids == ["from-child"]
    assert wakeup.COUNTERS.failures == failures + 1
    warnings = [r for r in caplog.records if r.name == "asyncq.store.sqlite.wakeup" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and order[0] in warnings[0].getMessage()


@pytest.mark.parametrize("names", [(), ("inotify", "kqueue"), ("INOTIFY",), ("",)])
def test_unknown_sources_are_refused_and_the_order_is_kept(names: tuple[str, ...]) -> None:
    kept = wakeup.use_sources("data_version", "poll")
    with pytest.raises(ValueError, match="wake-up sources must be some of"):
        wakeup.use_sources(*names)
    assert wakeup.use_sources(*kept) == ("data_version", "poll")


async def test_a_file_gone_from_its_path_waits_by_the_poll_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "queue.db"
    async with await Queue.open(path) as queue:
        failures = wakeup.COUNTERS.failures
        os.link(path, tmp_path / "kept.db")  # the file itself stays; its name goes
        os.unlink(path)
        await queue.wait_for_rows(0.01)  # the timeout, as before the watcher
        assert wakeup.COUNTERS.failures == failures + 1
        assert wakeup.watching(str(path), asyncio.get_running_loop()) is None
        os.link(tmp_path / "kept.db", path)
    assert any(r.name == "asyncq.store.sqlite.wakeup" and r.levelno == logging.WARNING for r in caplog.records)


APP_WRITE = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
con.execute("CREATE TABLE IF NOT EXISTS app_rows (x)")
con.execute("INSERT INTO app_rows VALUES (1)")
con.close()
"""


async def test_only_other_connections_commits_that_leave_pending_jobs_wake_a_file(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    async with await Queue.open(path) as queue:
        file = queue.store._file  # type: ignore[attr-defined]
        assert file.committed_elsewhere() is False  # the first read is the baseline
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", APP_WRITE, str(path))
        assert await child.wait() == 0
        assert file.committed_elsewhere() is False  # another connection committed, but to an app's own table
        await enqueue_from_child(path, "from-child")
        assert file.committed_elsewhere() is True
        assert file.committed_elsewhere() is False  # seen once
        await queue.enqueue("own", {"from": "here"})
        assert file.committed_elsewhere() is False  # its own commits never (the in-process event wakes for those)
        assert await queue.get("own") is not None


def read_by_the_loop(fd: int) -> bool:
    """Whether the running loop watches ``fd`` for reading (asyncio's selector map)."""
    return fd in asyncio.get_running_loop()._selector.get_map()  # type: ignore[attr-defined]


@needs_inotify
async def test_the_watch_is_read_only_while_a_file_waits_and_a_commit_made_meanwhile_is_seen_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.db"
    async with await Queue.open(path) as queue:
        await queue.wait_for_rows(0.001)  # starts the watcher
        watcher = wakeup.watching(str(path), asyncio.get_running_loop())
        assert watcher is not None and watcher.source == "inotify" and watcher._watch is not None
        fd = watcher._watch.fileno()
        assert not read_by_the_loop(fd)  # nobody waits: the file's writes do not turn the loop
        for n in range(20):
            await queue.enqueue(f"own-{n}", {})  # this process's writes, reported to nobody
        assert not read_by_the_loop(fd)
        await enqueue_from_child(path, "from-child")  # another process's commit while nobody waits
        wakeups = wakeup.COUNTERS.wakeups
        async with asyncio.timeout(SOON):  # far below the wait's own minute: the watcher saw it on the first look
            await queue.wait_for_rows(LONG_POLL)
        assert wakeup.COUNTERS.wakeups == wakeups + 1
        assert not read_by_the_loop(fd)  # the wait ended: unwatched again
        waiting = asyncio.create_task(queue.wait_for_rows(LONG_POLL))
        await eventually(lambda: read_by_the_loop(fd), "the waiting file's watch to be read by the loop")
        await enqueue_from_child(path, "from-child-2")  # and a commit during a wait wakes it
        async with asyncio.timeout(SOON):
            await waiting
        assert not read_by_the_loop(fd)


@pytest.mark.skipif(not timerfd.available(), reason="timerfd is Linux's")
async def test_a_precise_timer_fires_once_a_new_start_replaces_the_last_and_cancel_disarms_it() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    events = {name: asyncio.Event() for name in ("first", "control")}

    def on(name: str) -> Callable[[], None]:
        def fire() -> None:
            fired.append(name)
            events[name].set()

        return fire

    first, control = timerfd.PreciseTimer(loop, on("first")), timerfd.PreciseTimer(loop, on("control"))
    try:
        first.start(60.0)
        first.start(0.0002)  # replaces the minute
        async with asyncio.timeout(SOON):
            await events["first"].wait()
        first.start(0.001)
        first.cancel()  # disarmed: it never fires, though the control timer, set later, does
        control.start(0.05)
        async with asyncio.timeout(SOON):
            await events["control"].wait()
        assert fired == ["first", "control"]
    finally:
        first.close()
        control.close()


@pytest.mark.skipif(not (inotify.available() and timerfd.available()), reason="inotify and timerfd are Linux's")
async def test_inotifys_rechecks_run_on_a_timerfd_released_with_the_watcher(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    descriptors = timer_descriptors()
    async with await Queue.open(path) as queue:
        await queue.wait_for_rows(0.001)
        watcher = wakeup.watching(str(path), asyncio.get_running_loop())
        assert watcher is not None and watcher._precise is not None
        assert timer_descriptors() == descriptors + 1
        watcher._last_write = time.monotonic()  # a write just reported: re-checked within a tenth of a millisecond
        assert watcher._next_check() == wakeup.PRECISE_RECHECK_MIN_S
    assert watcher.closed and watcher._precise is None
    assert timer_descriptors() == descriptors


def timer_descriptors() -> int:
    """This process's open timerfd descriptors."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[timerfd]"
        except FileNotFoundError:
            continue
    return count
