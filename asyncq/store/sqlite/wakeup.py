"""Wake-ups across processes: a task waiting for rows on a SQLite file hears that another connection committed.

One ``Watcher`` per file and event loop (so one per file per process in the usual one-loop process), shared by
every queue and pool of that loop open on the file: started by the first wait, stopped when the last file
using it closes. It runs no thread and never writes. Whether another connection committed is each waiting
file's own question (``AsyncFile.committed_elsewhere``: ``PRAGMA data_version`` on the file's own connection,
which changes when any other connection commits and never for its own commits; ~3 µs in WAL, ~6 in DELETE),
so a pool is not woken by its own commits. When to ask comes from the first source that starts, in order:

- ``inotify`` (Linux): the file's directory is watched; a write to the file, its ``-wal`` or its ``-journal``
  makes the loop ask at once, and again (after an eighth of the time since the write, 0.1-50 ms on a timerfd,
  ``asyncq.store.sqlite.timerfd``; 1-50 ms on the loop's timers where there is none) while the write lock is
  still held (``BEGIN IMMEDIATE`` tried without waiting on a connection of the watcher's own, and rolled back):
  a WAL commit is visible only after its fsync, which follows the write the kernel reports. No write, no work:
  an idle pool costs nothing; and the events are read only while a file waits, so a busy pool's own writes
  never turn its loop. In DELETE mode the same events come from the ``-journal``'s life (its deletion is the
  commit) and the file's own writes.
- ``data_version``: the files asked on a timer while a task waits, 2 ms after a change and slowing to every
  50 ms while nothing changes (where there is no inotify, or it failed; each tick wakes the loop, which costs
  25-150 µs of CPU by how busy the machine is: at 20 ms a busy machine's idle pool spent 1.5 % of a core).
- ``poll``: no watcher; waiters see other processes' rows when their timeout ends (the pool's poll).

A source that fails is logged, counted (``COUNTERS.failures``) and replaced by the next one; the waiters' own
timeouts stay as the fallback in every case. The figures behind these choices are in docs/benchmarks.md ("How
the design was measured").
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from asyncq.store.sqlite import inotify, timerfd
from asyncq.store.sqlite.busy import BUSY_CODES, try_begin

log = logging.getLogger("asyncq.store.sqlite.wakeup")

INOTIFY, DATA_VERSION, POLL = "inotify", "data_version", "poll"
SOURCES = (INOTIFY, DATA_VERSION, POLL)
RECHECK_MIN_S = 0.001  # a re-read after a write waits at least this long (asyncio's timers: whole milliseconds) ...
PRECISE_RECHECK_MIN_S = 0.0001  # ... or this long on a timerfd (a WAL commit's fsync: a few tenths of a ms) ...
RECHECK_MAX_S = 0.05  # ... and at most this long: an eighth of the time since the write, in between
RECHECK_FRACTION = 8
WINDOW_S = 2.0  # how long after a write the version is still re-read (a slow disk's fsync)
DATA_VERSION_TICKS_S = (0.002, 0.05)  # the data_version source's poll while a task waits: first, slowest
DATA_VERSION_SLOWING = 1.5  # each read that finds no change waits this much longer for the next
_LOCKED = (*BUSY_CODES, sqlite3.SQLITE_PROTOCOL)  # a commit in progress: read later


@dataclass
class WakeupCounters:
    """This process's wake-up watchers, for logs and tests."""

    started: int = 0  #: watchers started
    stopped: int = 0  #: watchers stopped (the last file using one closed)
    wakeups: int = 0  #: changes seen that woke waiting tasks
    failures: int = 0  #: sources that failed (each logged; the next source took over)


COUNTERS = WakeupCounters()


class Timer(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What a watcher needs of its event loop (``asyncio``'s; the seam, ``aio.py``, passes it in)."""

    def add_reader(self, fd: int, callback: Callable[[], object]) -> None: ...

    def remove_reader(self, fd: int) -> bool: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer: ...


_order: tuple[str, ...] = SOURCES
_watchers: weakref.WeakKeyDictionary[Loop, dict[tuple[int, int], Watcher]] = weakref.WeakKeyDictionary()


def use_sources(*names: str) -> tuple[str, ...]:
    """Which sources watchers started from now on try, best first (by default ``inotify``, ``data_version``,
    ``poll``; ``use_sources("poll")`` turns cross-process wake-ups off). Returns the order it replaces."""
    global _order
    unknown = [name for name in names if name not in SOURCES]
    if not names or unknown:
        raise ValueError(f"wake-up sources must be some of {list(SOURCES)}, got {list(names)}")
    previous, _order = _order, tuple(names)
    return previous


class _WriteLock:
    """Whether some connection holds the file's write lock now (a write is in flight): ``BEGIN IMMEDIATE`` tried
    without waiting on a connection of its own, and rolled back at once (it never writes; ~5 µs)."""

    def __init__(self, path: str) -> None:
        self._con = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=rw", uri=True, isolation_level=None)
        try:
            self._con.execute("PRAGMA busy_timeout = 0")
        except BaseException:
            self._con.close()
            raise

    def held(self) -> bool:
        if not try_begin(self._con, _LOCKED):
            return True
        self._con.execute("ROLLBACK")
        return False

    def close(self) -> None:
        self._con.close()


class Listener(Protocol):
    """A file whose tasks wait for rows (``AsyncFile``)."""

    def committed_elsewhere(self) -> bool | None:
        """Whether another connection committed since the last call (``None``: cannot tell now, ask again)."""
        ...

    def notify(self) -> None:
        """Wake the tasks waiting on this file."""
        ...


class Watcher:
    """Tells the files added to it (``Listener`` s) to look when their file may have changed (module docstring).

    Whether a change is another connection's is each file's own question (``committed_elsewhere``: the version
    on its own connection, which its own commits leave alone), so a pool is not woken by its own commits; the
    watcher's own connection only tells when a reported write has landed, to stop re-reading."""

    def __init__(self, path: str, loop: Loop) -> None:
        self.path = os.path.realpath(path)
        self.source = POLL
        self.closed = False
        self._loop = loop
        self._users = 0  # the files sharing this watcher
        self._listeners: set[Listener] = set()
        self._write_lock: _WriteLock | None = None  # inotify: is a reported write still in flight?
        self._watch: inotify.DirectoryWatch | None = None
        self._reading = False  # the loop reads the watch's events (only while a file waits)
        base = os.path.basename(self.path)
        self._names = frozenset((base, f"{base}-wal", f"{base}-journal"))
        self._order: tuple[str, ...] = ()
        self._timer: Timer | None = None
        self._precise: timerfd.PreciseTimer | None = None  # inotify's re-checks, where timerfd works
        self._last_write: float | None = None  # when the last write was reported; None once none is in flight
        self._after_call = False  # a file could not tell (its connection in use): ask it when its call ends
        self._tick = DATA_VERSION_TICKS_S[0]

    # -- listeners ----------------------------------------------------------------------------------------

    def add(self, listener: Listener) -> None:
        """Tell ``listener`` of the next change (at once if another connection committed since it last looked)."""
        first = not self._listeners
        self._listeners.add(listener)
        if first and self._watch is not None and not self._listen():
            return  # the watch failed and the next source took over (it has checked already)
        if self.source != POLL:
            self._check()

    def discard(self, listener: Listener) -> None:
        self._listeners.discard(listener)
        if not self._listeners:
            self._cancel_timer()
            self._unlisten()

    @property
    def waiting(self) -> int:
        """How many files have tasks waiting on this watcher now."""
        return len(self._listeners)

    def local_write_done(self) -> None:
        """A file of this process finished a call: the write in flight may have been this one's, and a file that
        could not tell (its connection was in use) can now (a check now saves the timer's)."""
        if (self._last_write is not None or self._after_call) and self._listeners:
            self._check()

    # -- sources ------------------------------------------------------------------------------------------

    def start(self, order: tuple[str, ...]) -> None:
        """Set up the first source of ``order`` that works; each that fails is logged and counted."""
        self._order = order
        for position, name in enumerate(order):
            if name == POLL:
                break
            if name == INOTIFY and not inotify.available():  # not a failure: this platform has none
                log.debug("no inotify on this platform: %s waits by data_version", self.path)
                continue
            try:
                self._start_source(name)
            except Exception as error:
                self._stop_source()
                self._failed(name, error, order[position + 1 :])
                continue
            self.source = name
            return
        self.source = POLL

    def _start_source(self, name: str) -> None:
        if name == INOTIFY:
            self._write_lock = _WriteLock(self.path)
            self._watch = inotify.DirectoryWatch(os.path.dirname(self.path))
            if self._listeners:
                self._loop.add_reader(self._watch.fileno(), self._on_events)
                self._reading = True
            if timerfd.available():
                try:
                    self._precise = timerfd.PreciseTimer(self._loop, self._check)
                except OSError as error:  # not a failure of the source: its re-checks wait whole milliseconds
                    log.debug("no timerfd for %s (%r): re-checks by the loop's timers", self.path, error)

    def _stop_source(self) -> None:
        self._cancel_timer()
        if self._precise is not None:
            self._precise.close()
            self._precise = None
        if self._watch is not None:
            self._unlisten()
            self._watch.close()
            self._watch = None
        if self._write_lock is not None:
            self._write_lock.close()
            self._write_lock = None
        self._last_write = None

    def _failed(self, name: str, error: Exception, rest: tuple[str, ...]) -> None:
        COUNTERS.failures += 1
        fallback = rest[0] if rest else POLL
        log.warning("wake-up source %s failed on %s (%r): falling back to %s", name, self.path, error, fallback)

    def _fail_over(self, error: Exception) -> None:
        """The running source failed: the next one in the order takes over; the waiting files are told to look
        (a change may have gone unseen)."""
        failed = self.source
        self._stop_source()
        rest = self._order[self._order.index(failed) + 1 :]
        self._failed(failed, error, rest)
        self.source = POLL
        self.start(rest)
        for listener in list(self._listeners):
            listener.notify()
        if self.source != POLL:
            self._check()

    def close(self) -> None:
        """Stop the source; tasks still waiting are left to their timeouts."""
        if not self.closed:
            self.closed = True
            COUNTERS.stopped += 1
            self._stop_source()
            self.source = POLL

    # -- reading the versions -----------------------------------------------------------------------------

    def _listen(self) -> bool:
        """Read the watch's events while a file waits (``False`` if the watch failed meanwhile). Nobody reads them
        while no file waits: a busy pool's own writes cost no turn of its loop (~3 a job in one-at-a-time
        enqueues beside it; docs/benchmarks.md, "singles"). The kernel keeps what came meanwhile, read here."""
        if self._watch is None or self._reading:
            return True
        self._loop.add_reader(self._watch.fileno(), self._on_events)
        self._reading = True
        return self._read_events() is not None

    def _unlisten(self) -> None:
        if self._watch is not None and self._reading:
            self._loop.remove_reader(self._watch.fileno())
            self._reading = False

    def _on_events(self) -> None:
        if self._read_events() and self._listeners:
            self._check()

    def _read_events(self) -> bool | None:
        """Whether the events queued now report a write to the file (noted for the checks); ``None`` if the watch
        failed (the next source took over)."""
        if self._watch is None:
            return None
        try:
            events = self._watch.read()
        except Exception as error:
            self._fail_over(error)
            return None
        if any(mask & inotify.IN_IGNORED for mask, _ in events):
            self._fail_over(OSError(f"the watch on {os.path.dirname(self.path)} was removed"))
            return None
        if any(name in self._names or mask & inotify.IN_Q_OVERFLOW for mask, name in events):
            self._last_write = time.monotonic()
            return True
        return False

    def _check(self) -> None:
        """Ask every waiting file whether another connection committed (waking its tasks if so); schedule the
        next check while a reported write is still in flight."""
        self._cancel_timer()
        if self.source == POLL:
            return
        try:
            # Probed first: a write not in flight now has landed (or rolled back), so the files see it below.
            writing = self._last_write is not None and self._write_lock is not None and self._write_lock.held()
            self._after_call = self._tell_listeners()
        except Exception as error:
            self._fail_over(error)
            return
        if not writing:
            self._last_write = None
        delay = self._next_check()
        if delay is not None and self._listeners:
            self._timer = self._schedule(delay)

    def _schedule(self, delay: float) -> Timer:
        """The next check ``delay`` seconds from now: on the timerfd if there is one (to a tenth of a millisecond),
        else on the loop's timers."""
        if self._precise is not None and self.source == INOTIFY:
            try:
                self._precise.start(delay)
                return self._precise
            except OSError as error:
                log.debug("timerfd failed for %s (%r): re-checks by the loop's timers", self.path, error)
                self._precise.close()
                self._precise = None
        return self._loop.call_later(max(delay, RECHECK_MIN_S), self._check)

    def _tell_listeners(self) -> bool:
        """Wake the files another connection committed to; whether one could not tell (its connection busy)."""
        unsure = False
        for listener in list(self._listeners):
            changed = listener.committed_elsewhere()
            if changed:
                COUNTERS.wakeups += 1
                self._tick = DATA_VERSION_TICKS_S[0]
                listener.notify()
            unsure = unsure or changed is None
        return unsure

    def _next_check(self) -> float | None:
        if self.source == DATA_VERSION:
            tick, self._tick = self._tick, min(self._tick * DATA_VERSION_SLOWING, DATA_VERSION_TICKS_S[1])
            return tick
        if self._last_write is None:
            return None
        since = time.monotonic() - self._last_write
        if since > WINDOW_S:  # a writer holding the lock this long: its commit's own write will be reported
            self._last_write = None
            return None
        floor = RECHECK_MIN_S if self._precise is None else PRECISE_RECHECK_MIN_S
        return min(max(since / RECHECK_FRACTION, floor), RECHECK_MAX_S)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def acquire(path: str, loop: Loop) -> Watcher:
    """``loop``'s watcher of ``path``'s file, started if it is the first user (``release`` it)."""
    watcher = Watcher(path, loop)
    try:
        found = os.stat(watcher.path)
    except OSError as error:  # a file gone from its path: a watcher of its own, on the poll alone
        watcher._failed("watching", error, ())
        COUNTERS.started += 1
        watcher._users = 1
        return watcher
    per_loop = _watchers.setdefault(loop, {})
    key = (found.st_dev, found.st_ino)
    shared = per_loop.get(key)
    if shared is None:
        watcher.start(_order)
        COUNTERS.started += 1
        shared = per_loop[key] = watcher
    shared._users += 1
    return shared


def watching(path: str, loop: Loop) -> Watcher | None:
    """``loop``'s watcher of ``path``'s file, if one runs (for diagnostics and tests)."""
    try:
        found = os.stat(os.path.realpath(path))
    except OSError:
        return None
    return _watchers.get(loop, {}).get((found.st_dev, found.st_ino))


def release(watcher: Watcher) -> None:
    """One user fewer; the last one stops the watcher."""
    watcher._users -= 1
    if watcher._users > 0:
        return
    watcher.close()
    per_loop = _watchers.get(watcher._loop, {})
    for key, found in list(per_loop.items()):
        if found is watcher:
            del per_loop[key]
