"""Linux inotify through ``ctypes``: a non-blocking descriptor watching one directory, and its events by name.

Only what the wake-up watcher (``asyncq.store.sqlite.wakeup``) needs; no dependency. ``available()`` is false
off Linux or where libc has no inotify, and ``DirectoryWatch`` then raises ``OSError`` like any failed call.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000  # events were dropped: anything may have changed
IN_IGNORED = 0x8000  # the watch is gone (the directory was deleted or its file system unmounted)
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return libc if hasattr(libc, "inotify_init1") and hasattr(libc, "inotify_add_watch") else None


_LIBC = _libc()


def available() -> bool:
    """Whether this platform has inotify (Linux)."""
    return _LIBC is not None


def _checked(result: int, what: str, path: str = "") -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}", path or None)
    return result


class DirectoryWatch:
    """An inotify descriptor watching ``directory`` for writes, deletions and renames into it (``fileno()`` is
    for the event loop's ``add_reader``). ``OSError`` if it cannot be set up; nothing is left open then."""

    MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE

    def __init__(self, directory: str) -> None:
        if _LIBC is None:
            raise OSError(f"inotify is not available on {sys.platform}")
        self._fd = _checked(_LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
        try:
            watched = _LIBC.inotify_add_watch(self._fd, os.fsencode(directory), self.MASK)
            _checked(watched, "inotify_add_watch", directory)
        except BaseException:
            os.close(self._fd)
            raise

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[tuple[int, str]]:
        """The events queued now, as ``(mask, name)`` (``name`` empty for the directory's own); ``[]`` if none."""
        try:
            data = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset < len(data):
            _, mask, _, size = _HEADER.unpack_from(data, offset)
            start = offset + _HEADER.size
            events.append((mask, os.fsdecode(data[start : start + size].rstrip(b"\0"))))
            offset = start + size
        return events

    def close(self) -> None:
        os.close(self._fd)
