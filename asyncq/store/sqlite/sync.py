"""Enqueue from synchronous code, inside the caller's own ``sqlite3`` transaction.

``enqueue_sync(con, …)`` joins the transaction ``con`` has open, so the job commits or rolls back with
the caller's rows. On a connection with no open transaction it opens and commits its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from asyncq.core.clock import wall_clock_ms
from asyncq.core.dependencies import Dependency
from asyncq.core.jobs import DEFAULT_QUEUE, MAX_BODY_BYTES, Enqueued, JobSpec, NewJob, OnConflict, OnDependencyDeadName
from asyncq.core.jsontext import JSONInput
from asyncq.core.values import Duration, check_time
from asyncq.store.sqlite import engine
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.migrations import is_current, migrate_in_transaction
from asyncq.store.sqlite.schema import PRODUCT


def enqueue_sync(
    con: sqlite3.Connection,
    job_id: str,
    body: JSONInput,
    *,
    queue: str = DEFAULT_QUEUE,
    max_attempts: int = 3,
    ttl: Duration | None = None,
    delay: Duration | None = None,
    priority: int = 0,
    unique_key: str | None = None,
    on_conflict: OnConflict = "return",
    after: Sequence[str | Dependency] = (),
    on_dependency_dead: OnDependencyDeadName = "dead",
    group: str | None = None,
    limit_key: str | None = None,
    now_ms: int | None = None,
) -> Enqueued:
    """Add a job through the caller's connection: ``True`` if inserted, ``False`` if the same id and
    body exist, ``Conflict`` for another body; with a ``unique_key`` an active job of the queue holds, that job's id
    (``UniqueConflict`` with ``on_conflict="raise"``); ``limit_key`` as ``Queue.enqueue``'s. Creates asyncq's tables
    in that transaction if needed."""
    now = wall_clock_ms() if now_ms is None else check_time(now_ms)
    if not isinstance(con, sqlite3.Connection):
        raise TypeError(f"enqueue_sync takes a sqlite3.Connection, not {type(con).__name__}")
    spec = JobSpec(
        job_id,
        body,
        queue,
        max_attempts,
        ttl=ttl,
        delay=delay,
        priority=priority,
        unique_key=unique_key,
        on_conflict=on_conflict,
        after=after,
        on_dependency_dead=on_dependency_dead,
        group=group,
        limit_key=limit_key,
    )
    row = spec.to_row(now, MAX_BODY_BYTES)
    if con.in_transaction:
        return _enqueue(con, row)
    with write_transaction(con):
        return _enqueue(con, row)


def _enqueue(con: sqlite3.Connection, row: NewJob) -> Enqueued:
    if not is_current(con):
        migrate_in_transaction(con)
    return engine.enqueue_in_transaction(con, PRODUCT, row)
