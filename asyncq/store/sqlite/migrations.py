"""The product schema's versions, applied forward with ``PRAGMA user_version`` inside the caller's
write transaction (SQLite's DDL is transactional, so a failed migration leaves the file as it was)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from asyncq.store.sqlite.graph_schema import GRAPHS
from asyncq.store.sqlite.schedules import SCHEDULE_TABLES
from asyncq.store.sqlite.schema import (
    AUDIT_JOB_SEQ,
    CANCEL_REQUESTS,
    CONSOLE,
    ERROR_TABLES,
    FLOW_CONTROL,
    JOB_COUNTS,
    LIMITS,
    OFFERS,
    PENDING_BY_TIME,
    PRODUCT,
    PRODUCT_TABLES,
    RECOUNT,
    RESULT_TABLES,
    RETENTION,
    RETENTION_RULES,
    TASKS,
    UNIQUE_KEYS,
)

# Version 1's lifecycle indexes, kept word for word: version 2 replaces them with partial ones.
_V1_INDEXES = (
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_ready ON asyncq_jobs(queue, status)",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_lease ON asyncq_jobs(queue, status, lease_until)",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_deadline ON asyncq_jobs(status, deadline)",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_exhausted ON asyncq_jobs(status) WHERE attempts >= max_attempts",
    "CREATE INDEX IF NOT EXISTS asyncq_audit_id ON asyncq_audit(id)",
)

#: One statement of a step, or a function run on the connection for what one statement cannot say.
Statement = str | Callable[[sqlite3.Connection], None]

# Each entry moves the file from version ``index`` to ``index + 1``. Append only; never edit a step.
MIGRATIONS: tuple[tuple[Statement, ...], ...] = (
    (*PRODUCT_TABLES, *_V1_INDEXES),
    (
        "DROP INDEX IF EXISTS asyncq_jobs_ready",
        "DROP INDEX IF EXISTS asyncq_jobs_lease",
        "DROP INDEX IF EXISTS asyncq_jobs_deadline",
        "DROP INDEX IF EXISTS asyncq_jobs_exhausted",
        *(statement for statement in PRODUCT.ddl if statement.startswith("CREATE INDEX")),
    ),
    ERROR_TABLES,  # version 3: each failed attempt's error
    AUDIT_JOB_SEQ,  # version 4: audit rows name their job's seq
    (*JOB_COUNTS, *RECOUNT),  # version 5: the job counts kept by triggers, counted once from the rows
    RESULT_TABLES,  # version 6: tasks' results
    CANCEL_REQUESTS,  # version 7: a cancel requested while a job is leased
    FLOW_CONTROL,  # version 8: priorities, the queues' stored settings (pause, max_wait) and their audit
    UNIQUE_KEYS,  # version 9: a job's unique key, held by one active job of its queue at a time
    RETENTION,  # version 10: retention per terminal state, its audit, the index of ended jobs
    (*TASKS, *RETENTION_RULES),  # version 11: the task a job's body names; retention rules per task, queue, default
    SCHEDULE_TABLES,  # version 12: schedules as stored state, their events
    GRAPHS,  # version 13: dependencies and groups (the waiting status, edges, groups)
    LIMITS,  # version 14: concurrency and rate limits per queue and limit key, the rate's state, their audit
    CONSOLE,  # version 15: the console's operator audit, samples and workers seen; errors by type
    PENDING_BY_TIME,  # version 16: pending jobs by ready time indexed only beside a priority other than 0
    OFFERS,  # version 17: idle pools' offers, and the jobs enqueues claimed for them
)
SCHEMA_VERSION = len(MIGRATIONS)


def prepare_new_file(con: sqlite3.Connection) -> None:
    """On a file with no tables yet, turn on incremental auto-vacuum (settable only before the first table),
    so that pruning old jobs can give space back without rewriting the whole file. Outside a transaction."""
    if con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
        con.execute("PRAGMA auto_vacuum = INCREMENTAL")


def migrate_in_transaction(con: sqlite3.Connection) -> int:
    """Bring the file to ``SCHEMA_VERSION``; returns the version found. Refuses a newer file."""
    found = int(con.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise ValueError(f"queue file has schema version {found}, newer than this asyncq ({SCHEMA_VERSION})")
    for step in MIGRATIONS[found:]:
        for statement in step:
            if isinstance(statement, str):
                con.execute(statement)
            else:
                statement(con)
    if found != SCHEMA_VERSION:
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return found


def is_current(con: sqlite3.Connection) -> bool:
    """True if the file already has this version's tables (a read; no change)."""
    return int(con.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION
