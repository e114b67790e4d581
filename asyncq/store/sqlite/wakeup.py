"""Wake-ups across processes: a task waiting for rows on a SQLite file hears that another connection committed.

One ``Watcher`` per file and event loop (so one per file per process in the usual one-loop process), shared by
every queue and pool of that loop open on the file: started by the first wait, stopped when the last file
using it closes. It never writes, runs no thread, and wakes its waiters when ``PRAGMA data_version`` on a
read-only connection of its own changes (it changes when any other connection commits; ~3 µs a read in WAL,
~6 in DELETE). When to read it comes from the first source that starts, in this order:

- ``inotify`` (Linux): the file's directory is watched; a write to the file, its ``-wal`` or its ``-journal``
  (a ``-journal`` deleted is a DELETE-mode commit) makes the loop re-read the version at once, then after an
  eighth of the time since the write (1-50 ms) for up to 2 s, until it changes: a WAL commit is visible only
  after its fsync, which follows the write the kernel reports. No write, no work: an idle pool costs nothing.
- ``data_version``: the version read while a task waits, 2 ms after a change and slowing to every 20 ms while
  nothing changes (where there is no inotify, or it failed; each read wakes the loop, which costs a core's
  0.1-0.7 % at 20 ms by how busy the machine is).
- ``poll``: no watcher; waiters see other processes' rows when their timeout ends (the pool's poll).

A source that fails is logged, counted (``COUNTERS.failures``) and replaced by the next one; the waiters' own
timeouts stay as the fallback in every case. The figures behind these choices are in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from asyncq.store.sqlite import inotify

log = logging.getLogger("asyncq.store.sqlite.wakeup")

INOTIFY, DATA_VERSION, POLL = "inotify", "data_version", "poll"
SOURCES = (INOTIFY, DATA_VERSION, POLL)
RECHECK_MIN_S = 0.001  # a re-read after a write waits at least this long ...
RECHECK_MAX_S = 0.05  # ... and at most this long: an eighth of the time since the write, in between
RECHECK_FRACTION = 8
WINDOW_S = 2.0  # how long after a write the version is still re-read (a slow disk's fsync)
DATA_VERSION_TICKS_S = (0.002, 0.02)  # the data_version source's poll while a task waits: first, slowest
DATA_VERSION_SLOWING = 1.5  # each read that finds no change waits this much longer for the next
_LOCKED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL)  # a commit in progress: read later


@dataclass
class WakeupCounters:
    """This process's wake-up watchers, for logs and tests."""

    started: int = 0  #: watchers started
    stopped: int = 0  #: watchers stopped (the last file using one closed)
    wakeups: int = 0  #: changes seen that woke waiting tasks
    failures: int = 0  #: sources that failed (each logged; the next source took over)


COUNTERS = WakeupCounters()
_order: tuple[str, ...] = SOURCES
_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int], Watcher]] = (
    weakref.WeakKeyDictionary()
)


def use_sources(*names: str) -> tuple[str, ...]:
    """Which sources watchers started from now on try, best first (by default ``inotify``, ``data_version``,
    ``poll``; ``use_sources("poll")`` turns cross-process wake-ups off). Returns the order it replaces."""
    global _order
    unknown = [name for name in names if name not in SOURCES]
    if not names or unknown:
        raise ValueError(f"wake-up sources must be some of {list(SOURCES)}, got {list(names)}")
    previous, _order = _order, tuple(names)
    return previous


class _Version:
    """``PRAGMA data_version`` on a read-only connection of its own, never waiting for a lock."""

    def __init__(self, path: str) -> None:
        self._con = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None)
        try:
            self._con.execute("PRAGMA busy_timeout = 0")
            self._last = self._read()
        except BaseException:
            self._con.close()
            raise

    def _read(self) -> int:
        return int(self._con.execute("PRAGMA data_version").fetchone()[0])

    def changed(self) -> bool:
        """Whether another connection committed since the last call (``False`` while a commit holds the lock)."""
        try:
            version = self._read()
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF in _LOCKED:
                return False
            raise
        changed, self._last = version != self._last, version
        return changed

    def close(self) -> None:
        self._con.close()


class Watcher:
    """Wakes the ``asyncio.Event`` s added to it when another connection commits to its file (module docstring)."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = os.path.realpath(path)
        self.source = POLL
        self.closed = False
        self._loop = loop
        self._users = 0  # the files sharing this watcher
        self._waiters: set[asyncio.Event] = set()
        self._version: _Version | None = None
        self._watch: inotify.DirectoryWatch | None = None
        base = os.path.basename(self.path)
        self._names = frozenset((base, f"{base}-wal", f"{base}-journal"))
        self._order: tuple[str, ...] = ()
        self._timer: asyncio.TimerHandle | None = None
        self._last_write: float | None = None  # when the last write was reported; None once it is seen committed
        self._write_since_check = False
        self._tick = DATA_VERSION_TICKS_S[0]

    # -- waiters ------------------------------------------------------------------------------------------

    def add(self, waiter: asyncio.Event) -> None:
        """Set ``waiter`` at the next change (at once if one landed since the last read)."""
        self._waiters.add(waiter)
        if self.source != POLL:
            self._check()

    def discard(self, waiter: asyncio.Event) -> None:
        self._waiters.discard(waiter)
        if not self._waiters:
            self._cancel_timer()

    @property
    def waiting(self) -> int:
        """How many tasks wait on this watcher now."""
        return len(self._waiters)

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
        self._version = _Version(self.path)
        if name == INOTIFY:
            self._watch = inotify.DirectoryWatch(os.path.dirname(self.path))
            self._loop.add_reader(self._watch.fileno(), self._on_events)

    def _stop_source(self) -> None:
        self._cancel_timer()
        if self._watch is not None:
            self._loop.remove_reader(self._watch.fileno())
            self._watch.close()
            self._watch = None
        if self._version is not None:
            self._version.close()
            self._version = None

    def _failed(self, name: str, error: Exception, rest: tuple[str, ...]) -> None:
        COUNTERS.failures += 1
        fallback = rest[0] if rest else POLL
        log.warning("wake-up source %s failed on %s (%r): falling back to %s", name, self.path, error, fallback)

    def _fail_over(self, error: Exception) -> None:
        """The running source failed: the next one in the order takes over (its waiters are woken to re-claim)."""
        failed = self.source
        self._stop_source()
        rest = self._order[self._order.index(failed) + 1 :]
        self._failed(failed, error, rest)
        self.source = POLL
        self.start(rest)
        self._wake_all()

    def close(self) -> None:
        """Stop the source; waiters still waiting are left to their timeouts."""
        if not self.closed:
            self.closed = True
            COUNTERS.stopped += 1
            self._stop_source()
            self.source = POLL

    # -- reading the version ------------------------------------------------------------------------------

    def _on_events(self) -> None:
        if self._watch is None:
            return
        try:
            events = self._watch.read()
        except Exception as error:
            self._fail_over(error)
            return
        if any(mask & inotify.IN_IGNORED for mask, _ in events):
            self._fail_over(OSError(f"the watch on {os.path.dirname(self.path)} was removed"))
            return
        if any(name in self._names or mask & inotify.IN_Q_OVERFLOW for mask, name in events):
            self._last_write = time.monotonic()
            self._write_since_check = True
            if self._waiters:
                self._check()

    def _check(self) -> None:
        """Read the version; wake every waiter if it changed; schedule the next read if one is due."""
        self._cancel_timer()
        if self._version is None:  # on the poll alone
            return
        try:
            changed = self._version.changed()
        except Exception as error:
            self._fail_over(error)
            return
        if changed:
            COUNTERS.wakeups += 1
            self._tick = DATA_VERSION_TICKS_S[0]
            self._wake_all()
            if not self._write_since_check:  # writes are serialised: none since the last read, none in flight
                self._last_write = None
        self._write_since_check = False
        delay = self._next_read()
        if delay is not None and self._waiters:
            self._timer = self._loop.call_later(delay, self._check)

    def _next_read(self) -> float | None:
        if self.source == DATA_VERSION:
            tick, self._tick = self._tick, min(self._tick * DATA_VERSION_SLOWING, DATA_VERSION_TICKS_S[1])
            return tick
        if self._last_write is None:
            return None
        since = time.monotonic() - self._last_write
        if since > WINDOW_S:
            self._last_write = None
            return None
        return min(max(since / RECHECK_FRACTION, RECHECK_MIN_S), RECHECK_MAX_S)

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            waiter.set()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def acquire(path: str) -> Watcher:
    """The running loop's watcher of ``path``'s file, started if it is the first user (``release`` it)."""
    loop = asyncio.get_running_loop()
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


def watching(path: str) -> Watcher | None:
    """The running loop's watcher of ``path``'s file, if one runs (for diagnostics and tests)."""
    try:
        found = os.stat(os.path.realpath(path))
    except OSError:
        return None
    return _watchers.get(asyncio.get_running_loop(), {}).get((found.st_dev, found.st_ino))


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
