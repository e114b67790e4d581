"""The one seam between asyncio and the synchronous engine: the file every SQLite store of the product runs on.

A whole engine transaction runs as one call in the aiosqlite connection's own thread: one thread hop
per transaction (≈ 55-60 µs here) instead of one per statement, and no await can land inside
``BEGIN IMMEDIATE … COMMIT``. If the awaiting task is cancelled, the call still runs to its end in that
thread (commit or rollback), so a cancellation never leaves a lock behind; its outcome is then unknown
to the caller and must be read back from the row (``Queue.reconcile``).

The worker pool's group commit is the exception (``AsyncFile.run_held``): its statements run on the event
loop's thread once ``BEGIN IMMEDIATE`` holds the write lock, so they wait for nothing; a BEGIN that finds
another process's lock tries again every 0.5 ms from the loop (which runs other tasks meanwhile), and every
``COMMIT`` (the disk's wait) runs in the connection's thread. Run whole in that thread, each of a cycle's ~150
statement steps had to win the GIL back from a busy event loop, and each hop cost 1-3 ms of the loop's time: a
1 ms cycle took 5 ms (docs/benchmarks.md, "How the design was measured").
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NamedTuple, Self, TypeVar, cast

import aiosqlite
import anyio

from asyncq.store.sqlite import wakeup
from asyncq.store.sqlite.busy import (
    TimedConnection,
    as_busy,
    begin_immediate,
    is_busy,
    leaves_timeout_off,
    set_waiting,
    timeout_ms,
    try_begin,
)
from asyncq.store.sqlite.effects import effect_transaction

T = TypeVar("T")


async def run_sync(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sqlite3_connection, *args)`` in ``conn``'s thread, after everything queued before it. A lock
    held elsewhere past the busy timeout is ``SqliteBusy`` (a ``StoreBusy`` and a ``sqlite3.OperationalError``)."""
    raw: sqlite3.Connection = conn._conn  # aiosqlite keeps the sqlite3 connection private; reading it is safe
    try:
        return cast(T, await conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]
    except sqlite3.OperationalError as error:
        busy = as_busy(error)
        if busy is error:
            raise
        raise busy from None


def _data_version(con: sqlite3.Connection) -> int:
    return int(con.execute("PRAGMA data_version").fetchone()[0])


def _waiting(con: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(con, *args)`` with the connection's busy timeout in force (a write may have left it at 0)."""
    set_waiting(con, True)
    return fn(con, *args)


def _know_journal(con: sqlite3.Connection) -> None:
    if isinstance(con, TimedConnection):
        con.wal = str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"


def _rollback_if_open(con: sqlite3.Connection) -> None:
    if con.in_transaction:
        con.execute("ROLLBACK")


class _Rider(NamedTuple):
    """A write riding a group commit (``AsyncFile.write_or_ride``)."""

    inside: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]


class _Raised(NamedTuple):
    error: BaseException


_ALONE = object()  # a rider's outcome when the group commit failed first: it runs alone

# How long a write waits for the group commit it asked a host to run (``AsyncFile.write_or_ride``) before it runs
# alone: a pool's batcher takes a few loop turns to begin one; a loop so busy that it takes longer gains nothing.
RIDE_WAIT_SECONDS = 0.002


def _ride(con: sqlite3.Connection, riders: Sequence[_Rider]) -> list[Any]:
    """Each rider's write in its own savepoint, in order: its result, or ``_Raised`` (its savepoint rolled back).
    An error that ended the transaction (SQLite rolls back by itself on some I/O and memory errors) fails the
    whole group commit instead, and every rider runs alone after it."""
    outcomes: list[Any] = []
    for rider in riders:
        if rider.future.done():  # its caller was cancelled while it waited: nothing of it ran
            outcomes.append(_ALONE)
            continue
        con.execute("SAVEPOINT asyncq_rider")
        try:
            outcomes.append(rider.inside(con, *rider.args))
        except Exception as error:
            if not con.in_transaction:
                raise
            con.execute("ROLLBACK TO asyncq_rider")
            outcomes.append(_Raised(error))
        con.execute("RELEASE asyncq_rider")
    return outcomes


def _arrive(riders: Sequence[_Rider], outcomes: Sequence[Any]) -> None:
    """The group commit committed: each rider's outcome to its caller."""
    for rider, outcome in zip(riders, outcomes, strict=True):
        if not rider.future.done():
            rider.future.set_result(outcome)


def _send_alone(riders: Sequence[_Rider]) -> None:
    """Nothing of these riders committed: each still waiting runs alone, as it would have."""
    for rider in riders:
        if not rider.future.done():
            rider.future.set_result(_ALONE)


# How often a group commit that found the write lock held elsewhere tries again (``AsyncFile._begin_in_turn``).
LOCK_POLL_SECONDS = 0.0005


def _commit(con: sqlite3.Connection, landed: list[bool]) -> None:
    con.execute("COMMIT")
    landed.append(True)


class AppTransaction:
    """An open ``BEGIN IMMEDIATE`` on a file's connection, for the app's own SQL beside asyncq's rows.

    Usable only inside its block: afterwards every call raises ``RuntimeError`` (a statement would otherwise land
    in whatever transaction another task has open, or autocommit). A statement that ends the transaction itself
    (``COMMIT``, ``ROLLBACK``) is refused before it runs (``asyncq.store.sqlite.effects``), with ``RuntimeError``:
    the block is rolled back if that propagates, and still whole if the app catches it."""

    def __init__(self, owner: AsyncFile) -> None:
        self._file = owner
        self._open = False
        #: How many rows asyncq added in this transaction (waiters are woken after the commit if any).
        self.added = 0

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows."""
        rows: list[Any] = await self._run_step(_execute_inside, statement, parameters)
        return rows

    async def _run_step(self, fn: Callable[..., T], *args: Any) -> T:
        """Run an engine step inside this transaction, in the connection's thread."""
        if not self._open:
            raise RuntimeError("this transaction's block has ended: open a new one with transaction()")
        return await run_sync(self._file.conn, fn, *args)


def _execute_inside(con: sqlite3.Connection, statement: str, parameters: Sequence[Any] | dict[str, Any]) -> list[Any]:
    with effect_transaction(con) as tx:  # BEGIN, COMMIT, ROLLBACK are refused before they run
        return tx.execute(statement, parameters)


TxT = TypeVar("TxT", bound=AppTransaction)


class AsyncFile:
    """One SQLite file behind one aiosqlite connection: what every SQLite store of the product runs on.

    Writes of one process queue on an ``asyncio.Lock`` and run whole in the connection's thread; tasks waiting for
    new rows are woken in-process after a commit that added some, and by the file's wake-up watcher
    (``asyncq.store.sqlite.wakeup``) when another connection commits. A task holding an app transaction that calls the
    store again would wait for itself forever: that is refused at once with ``RuntimeError``.
    """

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None  # the task inside ``transaction()``, if any
        self._waiters: set[asyncio.Event] = set()
        self._watcher: wakeup.Watcher | None = None  # started by the first wait for rows
        self._version: int | None = None  # the connection's data_version when last read
        #: Whether another connection's commit may have left work for this file's waiters (``None``: any commit
        #: may): asked before waking them, so that commits to other tables wake nobody.
        self.may_have_work: Callable[[sqlite3.Connection], bool] | None = None
        self._closed = False
        #: Whether the last ``run_held`` found the write lock held by another connection (its BEGIN waited).
        self.begin_waited = False
        self._held_not_before = 0.0  # the loop's time before which the next ``run_held`` waits (``space_next_held``)
        #: While a ``run_held`` waits for the lock: the writes that ride in its transaction (``write_or_ride``).
        self._boarding: list[_Rider] | None = None
        #: Group commits that run when asked (a pool with room to claim: ``host_rides``), and the writes waiting
        #: for the one asked to run.
        self._hosts: list[Callable[[], bool]] = []
        self._invited: list[_Rider] = []
        self._locked = _Locked(self)

    @staticmethod
    async def connect(
        target: str, busy_timeout: float, setup: Callable[[sqlite3.Connection], object], *, uri: bool = False
    ) -> aiosqlite.Connection:
        """Connect in autocommit mode and run ``setup`` in the connection's thread; closed if it fails."""
        # check_same_thread=False: ``run_held`` runs statements on the loop's thread; the lock keeps every use
        # of the connection one at a time.
        conn = aiosqlite.connect(
            target,
            isolation_level=None,
            timeout=busy_timeout,
            check_same_thread=False,
            uri=uri,
            factory=TimedConnection,
        )
        try:
            await conn
        except BaseException:
            # aiosqlite stops its thread on a failed connect and answers the stop through this loop: wait for it
            # here, or it lands after ``asyncio.run`` closed the loop and prints "Event loop is closed".
            await asyncio.to_thread(conn._thread.join, 5)
            raise
        try:
            await run_sync(conn, setup)
            await run_sync(conn, _know_journal)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Close the connection (waits for the transaction in progress) and release the wake-up watcher."""
        async with self._locked:
            self._closed = True
            if self._watcher is not None:  # before the connection: the watcher's must never be the file's last
                wakeup.release(self._watcher)
                self._watcher = None
            await self.conn.close()
            await _ended(self.conn._thread)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(sqlite3_connection, *args, **kwargs)`` in the connection's thread, after every call queued before
        it, with the connection's busy timeout in force."""
        call = functools.partial(fn, **kwargs) if kwargs else fn
        async with self._locked:
            return await run_sync(self.conn, _waiting, call, *args)

    async def run_write(self, fn: Callable[..., T], *args: Any) -> T:
        """``run`` for an ``fn`` whose first statement is ``busy.begin_immediate`` (``connection.write_transaction``),
        which sets the busy timeout as it needs: in WAL mode a run of writes switches it no more."""
        async with self._locked:
            return await run_sync(self.conn, fn, *args)

    async def run_held(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(sqlite3_connection, *args)`` inside one write transaction, called on this (the loop's) thread.

        ``fn`` runs with the write lock held, so its statements never wait for a lock (keep it to short
        statements). ``BEGIN IMMEDIATE`` is tried here without waiting; while another connection holds the lock
        it is tried again in turn (``_begin_in_turn``); ``COMMIT`` (the disk's wait) always runs in the
        connection's thread. If ``fn`` or the commit fails, or the task is cancelled while BEGIN waits, the
        transaction is rolled back; once ``fn`` has run, the commit is shielded and lands or fails whole.

        Writes made through ``write_or_ride`` while this waits for the lock run first in the same transaction,
        each in a savepoint, and share its commit."""
        spaced = self._held_not_before - asyncio.get_running_loop().time()
        if spaced > 0:
            await asyncio.sleep(spaced)
        boarding, self._invited = self._invited, []
        landed: list[bool] = []  # the COMMIT's, once it has returned in the connection's thread
        if self._boarding is None:
            self._boarding = boarding
        try:
            async with self._locked:
                con: sqlite3.Connection = self.conn._conn
                try:
                    self.begin_waited = not self._begin_without_waiting(con)
                    if self.begin_waited:
                        await self._begin_in_turn(con)
                    if self._boarding is boarding:
                        self._boarding = None
                    outcomes = _ride(con, boarding)
                    result = fn(con, *args)
                    with anyio.CancelScope(shield=True):
                        await run_sync(self.conn, _commit, landed)
                except BaseException:
                    with anyio.CancelScope(shield=True):  # runs after a cancelled BEGIN, in the thread's order
                        await run_sync(self.conn, _rollback_if_open)
                    if landed:  # this task was cancelled while its COMMIT ran on, and landed, in the thread
                        _arrive(boarding, outcomes)
                    raise
                _arrive(boarding, outcomes)
                return result
        finally:
            if self._boarding is boarding:
                self._boarding = None
            _send_alone(boarding)  # those the commit answered are done already

    async def write_or_ride(self, alone: Callable[..., T], inside: Callable[..., T], *args: Any) -> T:
        """``run_write(alone, *args)``; or, while a ``run_held`` (the pool's group commit) waits for the lock,
        ``inside(con, *args)`` run in its transaction before its own statements, returning once that commits.

        Both calls wait for the lock anyway: riding, the write and the group commit share one ``COMMIT`` (one
        fsync), and the group commit's claim already sees what the write added. ``inside`` is ``alone`` without
        its ``BEGIN``/``COMMIT``; it runs in a savepoint, so what it raises leaves nothing of it behind. If the
        group commit fails before it commits, the write runs alone after it (its rows were rolled back with it).
        A caller cancelled while it waits is dropped if its write has not run yet.

        With no group commit waiting, a host (``host_rides``) is asked to run one now; a write it has not taken up
        within ``RIDE_WAIT_SECONDS`` runs alone."""
        boarding = None
        if self._holder is None:  # never beside an app's open transaction
            boarding = self._boarding
            if boarding is None and (self._invited or (self._hosts and self._ask_a_host())):
                boarding = self._invited
        if boarding is not None:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            if boarding is self._invited and not boarding:
                asyncio.get_running_loop().call_later(RIDE_WAIT_SECONDS, self._uninvite, boarding)
            boarding.append(_Rider(inside, args, future))
            outcome = await future
            if outcome is not _ALONE:
                if isinstance(outcome, _Raised):
                    raise outcome.error
                return cast(T, outcome)
        return await self.run_write(alone, *args)

    def host_rides(self, start: Callable[[], bool]) -> Callable[[], None]:
        """Let ``write_or_ride`` ask ``start()`` for a group commit to ride: it returns whether one will run now
        (``run_held``). Returns the function that withdraws the offer."""
        self._hosts.append(start)
        return lambda: self._hosts.remove(start)

    def _ask_a_host(self) -> bool:
        return any(start() for start in self._hosts)

    def _uninvite(self, invited: list[_Rider]) -> None:
        """The group commit asked for did not begin in time: its riders run alone."""
        if invited is self._invited:
            self._invited = []
            _send_alone(invited)

    def space_next_held(self, seconds: float) -> None:
        """The next ``run_held`` waits until ``seconds`` from now before it takes the lock (its caller's policy:
        ``queue_store.CONTENDED_CLAIM_SPACING_S``)."""
        self._held_not_before = asyncio.get_running_loop().time() + seconds

    def _begin_without_waiting(self, con: sqlite3.Connection, *, last: bool = False) -> bool:
        """``BEGIN IMMEDIATE`` if the write lock is free now; ``False`` (nothing open) if another connection
        holds it, or with ``last`` its busy error (``SqliteBusy``). A hop to the connection's thread costs 1-3 ms
        of a busy loop's time; this costs µs."""
        with self._not_waiting(con):
            if not last:
                return try_begin(con)
            try:
                con.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                raise as_busy(error) from None
            return True

    @contextmanager
    def _not_waiting(self, con: sqlite3.Connection) -> Iterator[None]:
        """The connection's busy timeout is 0 inside (a statement on the loop's thread must never wait), and left
        at 0 in WAL mode (``busy.TimedConnection``)."""
        timeout = timeout_ms(con)
        set_waiting(con, False, timeout)
        try:
            yield
        finally:
            if not leaves_timeout_off(con):
                set_waiting(con, True, timeout)

    async def _begin_in_turn(self, con: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` tried again every ``LOCK_POLL_SECONDS`` from the loop (which runs other tasks meanwhile)
        until the busy timeout has passed; then the busy error, as a BEGIN that waited in SQLite would raise.

        Not SQLite's own busy handler in the connection's thread: it sleeps 1, 2, 5 … 100 ms between tries, while
        a pool in another process holds the lock for a millisecond or two of each cycle and leaves it free for
        about as long. A process waiting in that handler missed those gaps and its siblings committed again and
        again (two processes: the least-served got 0.02× of the other's jobs; benchmarks/processes.py). Tried
        from a thread, each try waited for the GIL behind the busy loop (up to its 5 ms switch interval)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms(con) / 1000
        while True:
            await asyncio.sleep(LOCK_POLL_SECONDS)
            last = loop.time() >= deadline
            if self._begin_without_waiting(con, last=last) or last:
                return

    def notify(self) -> None:
        """Wake the tasks of this process waiting for new rows."""
        for event in self._waiters:
            event.set()

    async def wait_for_rows(self, timeout: float) -> None:
        """Return when new rows may be ready (this process committed some, or another connection committed to
        the file), or after ``timeout`` seconds: the poll, if the watcher is down."""
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        if self._watcher is None and not self._closed:
            self._watcher = wakeup.acquire(self.path, asyncio.get_running_loop())
        watcher = self._watcher
        if watcher is not None and len(self._waiters) == 1:
            watcher.add(self)
        try:
            with anyio.move_on_after(timeout):
                await waiter.wait()
        finally:
            self._waiters.discard(waiter)
            if watcher is not None and not self._waiters:
                watcher.discard(self)

    def committed_elsewhere(self) -> bool | None:
        """Whether another connection committed to the file since the last call, or before this file's first
        call: ``PRAGMA data_version`` on this file's own connection, which its own commits leave unchanged.
        ``None`` while the connection is in use or a commit holds the lock (ask again)."""
        if self._closed or self._lock.locked():
            return None
        con: sqlite3.Connection = self.conn._conn
        version = self._read_version(con)
        if version is None or version == self._version or self._version is None:
            self._version = self._version if version is None else version
            return None if version is None else False
        if self.may_have_work is not None:
            relevant = self._without_a_lock(con, self.may_have_work)
            if relevant is None:
                return None  # the version is kept: the change is asked about again
            self._version = version
            return relevant
        self._version = version
        return True

    def read_at_once(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(sqlite3_connection, *args)``, a read, on this (the loop's) thread now: no hop to the connection's
        thread. ``None`` if the connection is in use, or a writer's lock is in the way (ask ``run`` instead)."""
        if self._closed or self._lock.locked():
            return None
        return self._without_a_lock(self.conn._conn, lambda con: fn(con, *args))

    def _read_version(self, con: sqlite3.Connection) -> int | None:
        return self._without_a_lock(con, _data_version)

    def _without_a_lock(self, con: sqlite3.Connection, read: Callable[[sqlite3.Connection], T]) -> T | None:
        """``read(con)`` on this (the loop's) thread without waiting; ``None`` if a writer's lock is in the way
        (DELETE mode: the loop would wait in the busy handler)."""
        try:
            with self._not_waiting(con):
                return read(con)
        except sqlite3.OperationalError as error:
            if is_busy(error):
                return None
            raise

    @asynccontextmanager
    async def open_transaction(self, tx: TxT) -> AsyncIterator[TxT]:
        """All of ``tx``'s statements commit together, or all roll back if the block raises or is cancelled.

        A cancelled BEGIN or COMMIT still runs later in the connection's thread, so whether a transaction is
        open is decided there, after it, never from this thread before it has run."""
        async with self._locked:
            self._holder = asyncio.current_task()
            try:
                await run_sync(self.conn, begin_immediate)
                tx._open = True
                yield tx
                tx._open = False
                with anyio.CancelScope(shield=True):
                    await self.conn.execute("COMMIT")
            except BaseException:
                tx._open = False
                with anyio.CancelScope(shield=True):
                    await run_sync(self.conn, _rollback_if_open)
                raise
            finally:
                self._holder = None
        if tx.added:
            self.notify()


class FilePool:
    """Several connections to one file, each an ``AsyncFile`` with its own thread: a call runs on a free one,
    so up to ``len(files)`` calls run at once (SQLite still writes one transaction at a time; the others
    overlap their reads, their waits and their commits' fsyncs with it)."""

    def __init__(self, files: Sequence[AsyncFile]) -> None:
        self.files = list(files)
        self._free: asyncio.Queue[AsyncFile] = asyncio.Queue()
        for file in self.files:
            self._free.put_nowait(file)

    @classmethod
    async def open(
        cls, path: str, size: int, busy_timeout: float, setup: Callable[[sqlite3.Connection], object]
    ) -> FilePool:
        """``size`` connections to ``path``, each set up by ``setup``; all closed again if one fails."""
        files: list[AsyncFile] = []
        try:
            for _ in range(size):
                files.append(AsyncFile(await AsyncFile.connect(path, busy_timeout, setup), path))
        except BaseException:
            for file in files:
                await file.close()
            raise
        return cls(files)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(sqlite3_connection, *args)`` on a free connection, in its thread (waits for one to be free)."""
        file = await self._free.get()
        try:
            return await file.run(fn, *args)
        finally:  # a cancelled call's work may still be running: the next call on this file queues behind it
            self._free.put_nowait(file)

    async def close(self) -> None:
        """Close every connection (each after the call in progress on it)."""
        for file in self.files:
            await file.close()


async def _ended(thread: threading.Thread) -> None:
    """Wait (without blocking the loop, nor starting an executor thread) for ``thread`` to return, 5 s at most:
    aiosqlite answers a close from its thread, which then still has to return. A caller that returns once the store
    is closed (a consumer's ``run``, a process about to exit) finds it ended; a few microseconds as a rule."""
    for _ in range(10_000):
        if not thread.is_alive():
            return
        await asyncio.sleep(0.0005)


class _Locked:
    """``async with file._locked``: the file's lock for one call, refused at once to the task that holds the file's
    open transaction (it would wait for itself forever). A class, not a generator-based context manager: every
    store call enters it, and the generator's machinery was 8 Python calls of an enqueue's 74 on the loop."""

    __slots__ = ("_file",)

    def __init__(self, file: AsyncFile) -> None:
        self._file = file

    async def __aenter__(self) -> None:
        file = self._file
        if file._holder is not None and file._holder is asyncio.current_task():
            raise RuntimeError(
                "this task holds an open transaction on the store: use the transaction's own methods inside its "
                "block (the call would wait for the block to end, forever)"
            )
        await file._lock.acquire()
        if file._version is None:  # before the file's first call: a commit after it is seen as new
            try:
                file._version = file._read_version(file.conn._conn)
            except BaseException:
                file._lock.release()
                raise

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._file._lock.release()
        if exc_type is None and self._file._watcher is not None:
            # a write reported by the watcher may be this call's, landed now
            self._file._watcher.local_write_done()
