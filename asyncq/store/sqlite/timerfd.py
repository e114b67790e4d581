"""A one-shot timer the event loop reads like any descriptor, to a tenth of a millisecond: Linux's timerfd through
``ctypes``, for the wake-up watcher's re-checks (``asyncq.store.sqlite.wakeup``).

asyncio's own timers (``call_later``) wait whole milliseconds: the selector rounds epoll's timeout up to the next
one. A WAL commit whose write inotify reported lands a few tenths of a millisecond later (its fsync), so a re-check
a millisecond after the write found it landed ~0.7 ms late, every wake-up from another process
(docs/benchmarks.md, "singles"). ``available()`` is false off Linux or where libc has no timerfd;
``PreciseTimer`` then raises ``OSError`` like any failed call, and the watcher keeps ``call_later``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Protocol

CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return libc if hasattr(libc, "timerfd_create") and hasattr(libc, "timerfd_settime") else None


_LIBC = _libc()


def available() -> bool:
    """Whether this platform has timerfd (Linux)."""
    return _LIBC is not None


class Reader(Protocol):
    """What the timer needs of its event loop (``asyncio``'s)."""

    def add_reader(self, fd: int, callback: Callable[[], object]) -> None: ...

    def remove_reader(self, fd: int) -> bool: ...


class PreciseTimer:
    """Calls ``callback`` on ``loop`` once, ``start(delay)`` seconds from now (a new ``start`` replaces the last;
    ``cancel`` disarms it). ``OSError`` if it cannot be set up; nothing is left open then."""

    def __init__(self, loop: Reader, callback: Callable[[], object]) -> None:
        if _LIBC is None:
            raise OSError(f"timerfd is not available on {sys.platform}")
        fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_create: {os.strerror(errno)}")
        self._fd, self._loop, self._callback = fd, loop, callback
        try:
            loop.add_reader(fd, self._fired)
        except BaseException:
            os.close(fd)
            raise

    def start(self, delay: float) -> None:
        """Fire once, ``delay`` seconds from now (at least a microsecond: a zero would disarm it)."""
        whole, part = divmod(max(delay, 1e-6), 1.0)
        self._set(_Itimerspec(_Timespec(0, 0), _Timespec(int(whole), int(part * 1e9))))

    def cancel(self) -> None:
        """Disarm (a firing not yet read is dropped: a new setting resets the count the loop would read)."""
        self._set(_Itimerspec(_Timespec(0, 0), _Timespec(0, 0)))

    def _set(self, setting: _Itimerspec) -> None:
        assert _LIBC is not None
        if _LIBC.timerfd_settime(self._fd, 0, ctypes.byref(setting), None) < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_settime: {os.strerror(errno)}")

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # disarmed or replaced after epoll saw it fire
            return
        self._callback()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
