"""The chaos harness's store-specific part: opening the queue, reading it from outside, and checking its file.

Everything the harness knows about how a store keeps its jobs is here, behind ``Store``; the conductor, the
nemesis, the workers and the checker see only these methods. ``STORES`` names the two stores of the project,
``sqlite`` (one file) and ``postgresql`` (a server: ``--db URL``, or a cluster the harness starts itself,
``pg_cluster.running_cluster``; the class is in ``chaos_pg``); ``started`` opens either. A new store is a class
with the same methods, named in ``STORES`` (``--store NAME``) and opened by ``started``.

A store that can be hurt as a server also hands the nemesis a ``ServerFaults`` (PostgreSQL: backends ended with
``pg_terminate_backend``, and crash-restarts, ``pg_ctl restart -m immediate``, when the harness owns the cluster).
PostgreSQL has no file write lock: its ``write_lock_holder`` is the worker whose backend sits ``idle in
transaction`` (it sent ``BEGIN`` and statements, not yet ``COMMIT``), so the nemesis's last stop freezes a worker
holding a transaction open, with its row locks.

The inbox receiver keeps its events in SQLite whatever the queue's store is (``python -m asyncq.inbox``), so
reading its file is here too (``read_inbox``), apart from the queue's methods.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import struct
from collections.abc import Collection, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from asyncq import JobSpec, Queue

if TYPE_CHECKING:
    from chaos_pg import PostgresServer

ENQUEUE_BATCH = 1000


class Held(NamedTuple):
    """A lease as a kill left it: its fencing token and the job's attempts counted so far."""

    token: int
    attempts: int


class JobRow(NamedTuple):
    """A job as the checker reads it."""

    id: str
    body: str
    status: str
    reason: str | None
    attempts: int
    token: int


@contextmanager
def fresh_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A new read connection to a SQLite file, closed on exit (never one shared with a writer)."""
    with closing(sqlite3.connect(path, timeout=10, isolation_level=None)) as con:
        yield con


def integrity_check(path: Path) -> str:
    """``PRAGMA integrity_check`` of a SQLite file: ``'ok'`` or its first complaint."""
    with fresh_connection(path) as con:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])


class SqliteStore:
    """The queue in one SQLite file (``asyncq.Queue``, WAL): the project's only store today."""

    name = "sqlite"

    def __init__(self, folder: Path) -> None:
        self.path = folder / "queue.db"
        self._shm_fd: int | None = None

    @property
    def location(self) -> str:
        """What a worker process is given to open the same queue (``open_queue``)."""
        return str(self.path)

    async def enqueue(self, specs: Sequence[JobSpec]) -> None:
        """Add ``specs`` in transactions of ``ENQUEUE_BATCH`` jobs."""
        async with await Queue.open(self.location) as queue:
            for start in range(0, len(specs), ENQUEUE_BATCH):
                await queue.enqueue_many(specs[start : start + ENQUEUE_BATCH])

    def counts(self) -> dict[str, int]:
        """Jobs by status, every status present."""
        with fresh_connection(self.path) as con:
            rows = con.execute("SELECT status, count(*) FROM asyncq_jobs GROUP BY status").fetchall()
        return {"pending": 0, "leased": 0, "done": 0, "dead": 0} | dict(rows)

    def leases_of(self, owner: str) -> dict[str, Held]:
        """``{job id: (token, attempts)}`` of the leases ``owner`` holds (expired or not)."""
        with fresh_connection(self.path) as con:
            rows = con.execute(
                "SELECT id, token, attempts FROM asyncq_jobs WHERE status = 'leased' AND owner = ?", (owner,)
            )
            return {job_id: Held(token, attempts) for job_id, token, attempts in rows.fetchall()}

    def lease_owners(self) -> set[str]:
        """The owners holding at least one lease (expired or not)."""
        with fresh_connection(self.path) as con:
            rows = con.execute("SELECT DISTINCT owner FROM asyncq_jobs WHERE status = 'leased'").fetchall()
        return {owner for (owner,) in rows}

    def lease_states(self, ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """``{job id: (status, token)}`` for ``ids``."""
        with fresh_connection(self.path) as con:
            rows = con.execute(
                "SELECT id, status, token FROM asyncq_jobs WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(list(ids)),),
            )
            return {job_id: (status, token) for job_id, status, token in rows}

    def jobs(self) -> list[JobRow]:
        """Every job row, through a fresh connection."""
        with fresh_connection(self.path) as con:
            rows = con.execute("SELECT id, body, status, reason, attempts, token FROM asyncq_jobs").fetchall()
        return [JobRow(*row) for row in rows]

    def integrity(self) -> str:
        """The store's own consistency check: ``'ok'`` or what it found."""
        return integrity_check(self.path)

    def write_lock_holder(self, candidates: Collection[int] = (), *, fresh: bool = False) -> int | None:
        """The pid of the process holding the queue's write lock now, or ``None`` (``candidates`` and ``fresh``:
        unused here, every answer is read from the lock itself).

        In WAL mode a writer holds, from its ``BEGIN IMMEDIATE`` to its ``COMMIT``, SQLite's WAL write lock: a
        POSIX record lock on byte 120 of the ``-shm`` file (the unix VFS's ``UNIX_SHM_BASE`` plus lock 0).
        ``F_GETLK`` names the process holding a conflicting lock. The descriptor stays open until ``close``:
        closing any descriptor of a file drops every POSIX lock this process holds on it, which would pull
        the read locks from under this process's own SQLite connections."""
        if self._shm_fd is None:
            self._shm_fd = os.open(f"{self.path}-shm", os.O_RDONLY)
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 120, 1, 0)
        kind, _whence, _start, _length, pid = struct.unpack("hhqqi4x", fcntl.fcntl(self._shm_fd, fcntl.F_GETLK, query))
        return None if kind == fcntl.F_UNLCK else pid

    def close(self) -> None:
        """Release what ``write_lock_holder`` keeps open (call once no connection of this process is open)."""
        if self._shm_fd is not None:
            os.close(self._shm_fd)
            self._shm_fd = None


async def open_queue(store: str, location: str) -> Queue:
    """The queue a worker process runs its pool on."""
    if store in STORES:
        return await Queue.open(location)
    raise ValueError(f"unknown store {store!r}")


STORES = ("postgresql", "sqlite")


@contextmanager
def started(name: str, folder: Path, db: str | None) -> Iterator[tuple[Any, PostgresServer | None]]:
    """The run's store, and what the nemesis may do to its server (``None`` for SQLite). PostgreSQL without
    ``db``: a cluster of the harness's own in ``folder``'s temporary sibling, stopped when the block ends."""
    if name == "sqlite":
        yield SqliteStore(folder), None
        return
    from chaos_pg import PostgresServer, PostgresStore, owned_cluster  # it imports this module's rows

    with owned_cluster(db) as (url, cluster):
        store = PostgresStore(url)
        yield store, PostgresServer(store, cluster)


class InboxRows(NamedTuple):
    """What the receiver holds: its inbox rows (id, body, duplicates, conflicts) and the effect per item."""

    events: list[tuple[str, str, int, int]]
    effects: dict[str, int]


def read_inbox(path: Path) -> InboxRows:
    """The inbox file's rows and its ``stock`` effect (one item per job id, ``qty`` = times applied)."""
    with fresh_connection(path) as con:
        events = con.execute("SELECT id, body, duplicates, conflicts FROM asyncq_inbox").fetchall()
        effects = dict(con.execute("SELECT item, qty FROM stock").fetchall())
    return InboxRows(events, effects)
