"""The PostgreSQL queue's operator statements: one job, listings, history, the audit log, stats, prune, what the
store is. Every lifecycle change is ``transitions``'s; only prune (deleting finished jobs past their retention)
lives here.

Reads that must agree with each other run in one ``REPEATABLE READ`` read-only transaction (one snapshot). Stats
read the ``counts`` rows (kept by trigger, ``schema.COUNT_TRIGGERS``) for every status, so a sample costs the
same on a table of a million finished jobs as on an empty one; the live figures read the partial indexes of
pending and leased rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from asyncq.core.jobs import AttemptError, AuditEntry, Job
from asyncq.core.lifecycle import STATUSES, WAITING
from asyncq.core.stats import Stats, StatsReads, assemble_stats
from asyncq.store.port.queue import JobFilter
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.graph_schema import NEEDED_BY_GRAPH
from asyncq.store.postgres.schema import ENDED_AT, FOLD_COUNTS

JOB_COLUMNS = (
    "seq, id, queue, body, status, attempts, max_attempts, token, available_at, deadline, owner, lease_until, reason"
)
_REDRIVES = "(SELECT count(*) FROM {schema}.audit a WHERE a.job_seq = j.seq AND a.action = 'redrive') AS redrives"
#: What a job record has after its columns: its redrive count, its priority, a cancel request not yet carried out,
#: its unique key, its task, its group, how many dependencies it still waits for, and its limit key.
JOB_EXTRAS = f"{_REDRIVES}, j.priority, j.cancel_requested_at, j.unique_key, j.task, j.group_name, j.waits, j.limit_key"
_LISTED = (
    f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {{schema}}.jobs j WHERE {{where}} ORDER BY seq {{order}} LIMIT {{limit}}"
)
GET_JOB = f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {{schema}}.jobs j WHERE id = $1"
ERRORS_OF = "SELECT attempt, at_ms, type, message, traceback FROM {schema}.errors WHERE job_seq = $1 ORDER BY seq"
LAST_ERRORS = """
SELECT DISTINCT ON (job_seq) job_seq, attempt, at_ms, type, message, traceback FROM {schema}.errors
WHERE job_seq = ANY($1::bigint[]) ORDER BY job_seq, seq DESC
"""
AUDIT_COLUMNS = "seq, id, action, token, at_ms, note, reason, op_seq"
HISTORY = f"SELECT {AUDIT_COLUMNS} FROM {{schema}}.audit WHERE id = $1 ORDER BY seq"
AUDIT_LOG = f"SELECT {AUDIT_COLUMNS} FROM {{schema}}.audit ORDER BY seq DESC LIMIT $1"

COUNTS = "SELECT status, reason, sum(n)::bigint FROM {schema}.counts GROUP BY status, reason HAVING sum(n) <> 0"
OLDEST_READY = (  # one seek on jobs_ready_at
    "SELECT min(available_at + 0) FROM {schema}.jobs WHERE status = 'pending' AND available_at + 0 <= $1"
)
EXPIRED_LEASES = "SELECT count(*) FROM {schema}.jobs WHERE status = 'leased' AND lease_until <= $1"
LEASES_BY_OWNER = """
SELECT owner, count(*), min(lease_until) FROM {schema}.jobs WHERE status = 'leased'
GROUP BY owner ORDER BY owner COLLATE "C"
"""
ATTEMPTS_HISTOGRAM = """
SELECT attempts, count(*) FROM {schema}.jobs WHERE status IN ('pending', 'leased') GROUP BY attempts ORDER BY attempts
"""

# When a finished job ended (the SQLite driver's rule, ``schema.ENDED_AT``): finish and cancel stamp
# ``available_at``; a deadline or exhausted row is dated by its deadline. $1 cutoff, $2 done?, $3 dead?.
# A job a graph still needs is never pruned (``graph_schema.NEEDED_BY_GRAPH``, its ``{schema}`` filled by ``q``).
_PRUNABLE = f"((($2 AND status = 'done') OR ($3 AND status = 'dead')) AND {ENDED_AT} < $1 AND NOT {NEEDED_BY_GRAPH})"
PRUNABLE_COUNTS = f"SELECT status, count(*) FROM {{schema}}.jobs j WHERE {_PRUNABLE} GROUP BY status"
PRUNABLE_IDS = f"SELECT id FROM {{schema}}.jobs j WHERE {_PRUNABLE} ORDER BY seq LIMIT $4"
# Removing the finished jobs ``doomed`` names, shared by prune and retention: their errors and results go with
# them, audit rows stay. ``doomed`` locks its rows (``FOR UPDATE SKIP LOCKED``: a row a redrive holds is left for
# the next step) and is re-checked on the row it locked, so a job redriven since the snapshot is never removed.
REMOVE_DOOMED = """WITH doomed AS MATERIALIZED ({doomed} FOR UPDATE SKIP LOCKED
), errors AS (
  DELETE FROM {{schema}}.errors WHERE job_seq IN (SELECT seq FROM doomed)
), results AS (
  DELETE FROM {{schema}}.results WHERE job_seq IN (SELECT seq FROM doomed)
), dependant_edges AS (
  DELETE FROM {{schema}}.edges WHERE dependant IN (SELECT seq FROM doomed)
), dependency_edges AS (
  DELETE FROM {{schema}}.edges
  WHERE dependency IN (SELECT seq FROM doomed) AND dependant NOT IN (SELECT seq FROM doomed)
), deleted AS (
  DELETE FROM {{schema}}.jobs WHERE seq IN (SELECT seq FROM doomed) RETURNING seq
)
SELECT (SELECT count(*) FROM deleted), (SELECT max(seq) FROM doomed)"""
# One bounded batch, walking the primary key from ``$4`` (the last seq of the batch before): each batch is its own
# short transaction, so a prune holds no lock for long and never rewrites the table. $5 the batch size.
PRUNE_BATCH = REMOVE_DOOMED.format(
    doomed=f"SELECT seq FROM {{schema}}.jobs j WHERE seq > $4 AND {_PRUNABLE} ORDER BY seq LIMIT $5"
)
PRUNE_BATCH_ROWS = 1_000
# Results kept past their task's retention, whatever their job's age (the job stays, without it). $1 now.
PRUNE_EXPIRED_RESULTS = "DELETE FROM {schema}.results WHERE expires_at <= $1"
RESULT_OF = "SELECT value FROM {schema}.results WHERE job_seq = $1"
TABLE_BYTES = "SELECT pg_total_relation_size(to_regclass($1))"

SETTINGS = ("synchronous_commit", "fsync", "full_page_writes", "server_version", "default_transaction_isolation")


def q(statement: str, schema: str) -> str:
    """``statement`` for the queue in ``schema``."""
    return statement.format(schema=schema)


def _job(row: Sequence[Any], body: bool = True) -> Job:
    job = Job.from_row(tuple(row))
    return job if body else replace(job, body=None)


async def get_job(conn: Connection, schema: str, job_id: str) -> Job | None:
    """One job with its redrive count and every failed attempt's error, or ``None`` (one snapshot)."""
    row = await conn.fetchrow(q(GET_JOB, schema), job_id)
    if row is None:
        return None
    errors = await conn.fetch(q(ERRORS_OF, schema), row["seq"])
    result = await conn.fetchval(q(RESULT_OF, schema), row["seq"])
    return replace(_job(row), errors=tuple(AttemptError(*error) for error in errors), result_json=result)


async def list_jobs(conn: Connection, schema: str, which: JobFilter) -> list[Job]:
    """Jobs matching ``which``, oldest first from ``after`` (or newest first)."""
    statement, arguments = _listing(which)
    rows = await conn.fetch(q(statement, schema), *arguments)
    jobs = [_job(row, which.body) for row in rows]
    if not (which.errors and jobs):
        return jobs
    last = {
        row[0]: AttemptError(*row[1:]) for row in await conn.fetch(q(LAST_ERRORS, schema), [job.seq for job in jobs])
    }
    return [replace(job, errors=(last[job.seq],)) if job.seq in last else job for job in jobs]


def _listing(which: JobFilter) -> tuple[str, list[Any]]:
    """``list_jobs``'s statement with only the filters given, the status as a literal (one of ``STATUSES``, checked
    by the facade), so that a generic plan still takes the status's partial index (a dead listing: jobs_dead)."""
    terms: list[str] = []
    arguments: list[Any] = []
    if which.status is not None:
        assert which.status in STATUSES, which.status
        terms.append(f"status = '{which.status}'")
        if which.status == WAITING:  # the index of jobs with edges not met (``graph_schema``) holds every waiting job
            terms.append("waits > 0")
    for column, value in (("queue", which.queue), ("reason", which.reason)):
        if value is not None:
            arguments.append(value)
            terms.append(f"{column} = ${len(arguments)}")
    if not which.newest:
        arguments.append(which.after)
        terms.append(f"seq > ${len(arguments)}")
    arguments.append(which.limit)
    where = " AND ".join(terms) or "TRUE"
    order = "DESC" if which.newest else "ASC"
    return _LISTED.format(where=where, order=order, limit=f"${len(arguments)}", schema="{schema}"), arguments


async def history(conn: Connection, schema: str, job_id: str) -> list[AuditEntry]:
    """One job's audit rows, oldest first."""
    return [AuditEntry(*row) for row in await conn.fetch(q(HISTORY, schema), job_id)]


async def audit_log(conn: Connection, schema: str, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` audit rows, newest first."""
    return [AuditEntry(*row) for row in await conn.fetch(q(AUDIT_LOG, schema), limit)]


async def read_stats(conn: Connection, schema: str, now_ms: int) -> Stats:
    """Every figure of ``Stats``, inside the caller's one snapshot (assembled by ``core.stats``)."""
    reads = StatsReads(
        counts=[(status, reason, n) for status, reason, n in await conn.fetch(q(COUNTS, schema))],
        attempts=[(tries, n) for tries, n in await conn.fetch(q(ATTEMPTS_HISTOGRAM, schema))],
        leases=[(owner, n, first) for owner, n, first in await conn.fetch(q(LEASES_BY_OWNER, schema))],
        expired=await conn.fetchval(q(EXPIRED_LEASES, schema), now_ms),
        oldest_ready=await conn.fetchval(q(OLDEST_READY, schema), now_ms),
    )
    return assemble_stats(now_ms, reads)


def prune_params(cutoff_ms: int, statuses: Sequence[str]) -> tuple[int, bool, bool]:
    """The first three parameters of every prune statement."""
    return cutoff_ms, "done" in statuses, "dead" in statuses


async def prunable(
    conn: Connection, schema: str, params: tuple[int, bool, bool], limit: int
) -> tuple[dict[str, int], list[str]]:
    """Counts by status of the jobs a prune would delete, and the first ``limit`` of their ids (``-1``: all)."""
    counts = {str(status): int(n) for status, n in await conn.fetch(q(PRUNABLE_COUNTS, schema), *params)}
    ids = [str(row[0]) for row in await conn.fetch(q(PRUNABLE_IDS, schema), *params, None if limit < 0 else limit)]
    return {status: counts.get(status, 0) for status in ("done", "dead")}, ids


async def prune_batch(
    conn: Connection, schema: str, params: tuple[int, bool, bool], after: int, size: int = PRUNE_BATCH_ROWS
) -> tuple[int, int | None]:
    """Delete up to ``size`` prunable jobs past ``seq = after`` and their errors (audit rows stay): how many,
    and the last seq looked at (``None``: nothing was left)."""
    row = await conn.fetchrow(q(PRUNE_BATCH, schema), *params, after, size)
    assert row is not None
    return int(row[0]), None if row[1] is None else int(row[1])


async def prune_expired_results(conn: Connection, schema: str, now_ms: int) -> int:
    """Delete the results kept past their retention; how many."""
    done = await conn.execute(q(PRUNE_EXPIRED_RESULTS, schema), now_ms)
    return int(done.split()[-1])


async def fold_counts(conn: Connection, schema: str) -> None:
    """Sum the counter rows of ended backends into one (their total is unchanged)."""
    await conn.execute(q(FOLD_COUNTS, schema))


async def table_bytes(conn: Connection, schema: str) -> int:
    """The jobs table's size on disk, its indexes and TOAST included."""
    return int(await conn.fetchval(TABLE_BYTES, f"{schema}.jobs") or 0)
