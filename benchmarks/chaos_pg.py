"""The chaos harness on PostgreSQL (``--store postgresql``): the queue read from outside, and the server's faults.

``PostgresStore`` has ``SqliteStore``'s methods (``chaos_store``), each a query through a connection of the calling
thread's own (the nemesis and its recovery watch run in two threads), reconnected and retried while the server
is down or the backend was ended: the nemesis's own faults must not stop the nemesis. ``jobs`` and
``integrity``, the checker's reads, each take a fresh connection.

``PostgresServer`` is what the nemesis does to the server during its kill phases: end every client backend but
its own (``pg_terminate_backend``: the pools', the listeners'), and crash-restart it (``pg_ctl restart -m
immediate``: every backend killed without a checkpoint, recovery from the WAL) when the harness owns the cluster
(``--store postgresql`` without ``--db``); on a server of ``--db URL`` the restarts are skipped.

The run's tables go in a schema of their own (``?schema=chaos_<pid>`` unless the URL names one), so a ``--db``
server's other schemas are left alone and a run never starts on an earlier run's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
from chaos_store import ENQUEUE_BATCH, Held, JobRow
from pg_cluster import Cluster, running_cluster

from asyncq import JobSpec, Queue
from asyncq.store.postgres.connection import parse_url

RETRY_FOR_S = 120.0  # how long a read waits for the server to come back


@contextlib.contextmanager
def owned_cluster(db: str | None) -> Iterator[tuple[str, Cluster | None]]:
    """The URL the run uses (with its schema) and the cluster the harness started (``None`` with ``db``)."""
    if db is not None:
        yield with_schema(db), None
        return
    with running_cluster("127.0.0.1") as cluster:
        yield with_schema(cluster.url()), cluster


def with_schema(url: str) -> str:
    """``url`` with ``schema=chaos_<pid>`` added unless it names a schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(name == "schema" for name, _ in query):
        query.append(("schema", f"chaos_{os.getpid()}"))
    return urlunsplit(parts._replace(query=urlencode(query)))


def split_url(url: str) -> tuple[str, str]:
    """asyncpg's DSN (asyncq's options removed) and the schema the URL names (asyncq's own parse of it)."""
    target = parse_url(url)
    return target.dsn, target.schema


# InternalClientError: asyncpg's protocol left mid-operation when the nemesis ended this backend during a query
# ("cannot switch to state 12; another operation is in progress"): the connection is unusable, and was the recovery
# watcher's end (its thread died, and every recovery after it was read at the run's end: a p50 of 14-20 s).
LOST = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.InternalClientError,
)
ENDED = (asyncpg.AdminShutdownError, asyncpg.CrashShutdownError, asyncpg.ConnectionFailureError)


class Reader:
    """One connection for the calling thread, on a loop of that thread's own; a query that meets a lost
    connection (ended, restarted, not up yet) reconnects and runs again until ``RETRY_FOR_S`` passes."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._local = threading.local()

    def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                return self._loop().run_until_complete(self._fetch(sql, args))
            except (*LOST, *ENDED) as error:
                self._drop()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"PostgreSQL did not answer for {RETRY_FOR_S} s: {error}") from error
                time.sleep(0.05)  # a backoff before reconnecting, not a synchronisation

    def _loop(self) -> asyncio.AbstractEventLoop:
        if getattr(self._local, "loop", None) is None:
            self._local.loop, self._local.conn = asyncio.new_event_loop(), None
        loop: asyncio.AbstractEventLoop = self._local.loop
        return loop

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:
        if self._local.conn is None or self._local.conn.is_closed():
            self._local.conn = await asyncpg.connect(self.dsn, timeout=5)
        rows: list[asyncpg.Record] = await self._local.conn.fetch(sql, *args, timeout=30)
        return rows

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.terminate()

    def close(self) -> None:
        """Close this thread's connection and loop."""
        self._drop()
        loop = getattr(self._local, "loop", None)
        if loop is not None:
            loop.close()
            self._local.loop = None

    def fresh(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """``sql`` through a new connection, closed after (the checker's reads), retried like ``fetch``."""

        async def once() -> list[asyncpg.Record]:
            conn = await asyncpg.connect(self.dsn, timeout=5)
            try:
                rows: list[asyncpg.Record] = await conn.fetch(sql, *args, timeout=60)
                return rows
            finally:
                await conn.close()

        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                return asyncio.run(once())
            except (*LOST, *ENDED):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class PostgresStore:
    """The queue in a PostgreSQL schema (``asyncq.Queue`` on the URL)."""

    name = "postgresql"

    def __init__(self, url: str) -> None:
        self.url = url
        dsn, self.schema = split_url(url)
        self.reader = Reader(dsn)
        self._port_owners: dict[int, int] = {}  # a worker's connection's local port → its pid (write_lock_holder)

    @property
    def location(self) -> str:
        """What a worker process is given to open the same queue (``open_queue``): the URL."""
        return self.url

    def _q(self, sql: str) -> str:
        return sql.format(jobs=f"{self.schema}.jobs", counts=f"{self.schema}.counts")

    async def enqueue(self, specs: Sequence[JobSpec]) -> None:
        """Add ``specs`` in transactions of ``ENQUEUE_BATCH`` jobs."""
        async with await Queue.open(self.location) as queue:
            for start in range(0, len(specs), ENQUEUE_BATCH):
                await queue.enqueue_many(specs[start : start + ENQUEUE_BATCH])

    def counts(self) -> dict[str, int]:
        rows = self.reader.fetch(self._q("SELECT status, count(*) FROM {jobs} GROUP BY status"))
        return {"pending": 0, "leased": 0, "done": 0, "dead": 0} | {str(s): int(n) for s, n in rows}

    def leases_of(self, owner: str) -> dict[str, Held]:
        sql = "SELECT id, token, attempts FROM {jobs} WHERE status = 'leased' AND owner = $1"
        return {str(i): Held(int(t), int(a)) for i, t, a in self.reader.fetch(self._q(sql), owner)}

    def lease_owners(self) -> set[str]:
        rows = self.reader.fetch(self._q("SELECT DISTINCT owner FROM {jobs} WHERE status = 'leased'"))
        return {str(owner) for (owner,) in rows}

    def lease_states(self, ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        rows = self.reader.fetch(self._q("SELECT id, status, token FROM {jobs} WHERE id = ANY($1::text[])"), list(ids))
        return {str(i): (str(s), int(t)) for i, s, t in rows}

    def jobs(self) -> list[JobRow]:
        rows = self.reader.fresh(self._q("SELECT id, body, status, reason, attempts, token FROM {jobs}"))
        return [JobRow(*row) for row in rows]

    def integrity(self) -> str:
        """``'ok'``, or what disagrees: a leased row without owner or lease, a row past its attempts, or the
        trigger-kept ``counts`` against the rows by status."""
        bad = self.reader.fresh(self._q(
            "SELECT count(*) FROM {jobs} WHERE (status = 'leased') <> (owner IS NOT NULL AND lease_until IS NOT NULL)"
            " OR attempts > max_attempts OR attempts < 0 OR (status = 'dead') <> (reason IS NOT NULL)"
        ))[0][0]  # fmt: skip
        rows = dict(self.reader.fresh(self._q("SELECT status, count(*) FROM {jobs} GROUP BY status")))
        kept = dict(self.reader.fresh(self._q("SELECT status, sum(n) FROM {counts} GROUP BY 1 HAVING sum(n) <> 0")))
        problems = [f"{bad} rows break an invariant"] if bad else []
        if {k: int(v) for k, v in rows.items()} != {k: int(v) for k, v in kept.items()}:
            problems.append(f"counts {dict(kept)} but rows {dict(rows)}")
        return "; ".join(problems) or "ok"

    def write_lock_holder(self, candidates: Collection[int] = (), *, fresh: bool = False) -> int | None:
        """The pid among ``candidates`` whose backend is ``idle in transaction`` now (it began a transaction and
        waits to send the rest), or ``None``: a backend's ``client_port`` is the worker's local TCP port, found
        among the socket inodes of the candidates' descriptors (``/proc``)."""
        sql = (
            "SELECT client_port FROM pg_stat_activity WHERE state = 'idle in transaction'"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        ports = {int(port) for (port,) in self.reader.fetch(sql) if port is not None}
        if not ports:
            return None

        def owner() -> int | None:
            return next((pid for port in ports if (pid := self._port_owners.get(port)) in candidates), None)

        # Which process owns a port is kept from the last look (a pool keeps its connections): reading /proc for
        # every answer took longer than a worker's transaction stays open on a fast disk, and every stop missed.
        # ``fresh`` (the check of a stopped worker) reads it again: a port a reconnecting pool gave up may now be
        # another process's, and a kept answer would name the wrong one.
        found = None if fresh else owner()
        if found is None:
            self._port_owners = port_owners(candidates)
            found = owner()
        return found

    def close(self) -> None:
        self.reader.close()


def port_owners(pids: Collection[int]) -> dict[int, int]:
    """The local TCP port of each socket of ``pids``, mapped to its process."""
    inode_port: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                inode_port[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return {inode_port[inode]: pid for pid in pids for inode in socket_inodes(pid) if inode in inode_port}


def socket_inodes(pid: int) -> set[str]:
    """The inodes of process ``pid``'s socket descriptors (empty if it is gone)."""
    found = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, PermissionError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    found.add(target[8:-1])
    return found


@dataclass
class PostgresServer:
    """The server faults the nemesis adds on PostgreSQL, and their counts."""

    store: PostgresStore
    cluster: Cluster | None  # crash-restarts only on a cluster the harness owns
    restarts: int = 0
    restart_s: float = 0.0
    terminations: int = 0
    backends_ended: int = 0

    @property
    def can_restart(self) -> bool:
        return self.cluster is not None

    def end_backends(self) -> None:
        """``pg_terminate_backend`` of every client backend but the nemesis's own connection."""
        sql = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        self.backends_ended += int(self.store.reader.fetch(sql)[0][0])
        self.terminations += 1

    def crash_restart(self) -> None:
        """``pg_ctl restart -m immediate``; returns once the server accepts connections again."""
        assert self.cluster is not None
        started = time.monotonic()
        self.cluster.crash_restart()
        self.restarts += 1
        self.restart_s += time.monotonic() - started

    def figures(self) -> dict[str, Any]:
        return {
            "server_restarts": self.restarts,
            "server_restart_s": round(self.restart_s, 2),
            "backend_terminations": self.terminations,
            "backends_ended": self.backends_ended,
            "restarts_skipped": None if self.can_restart else "a server of --db: not the harness's to restart",
        }
