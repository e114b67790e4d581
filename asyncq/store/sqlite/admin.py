"""The SQLite driver's operator statements: listing, history, the audit log, prune, backup and what a file is.

Run in the connection's thread by ``asyncq.store.sqlite.queue_store``. Every lifecycle change (enqueue, redrive,
cancel) is the engine's; only the two maintenance operations with no lifecycle meaning live here: deleting
finished jobs past their retention, and SQLite's online backup.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from asyncq.core.jobs import AttemptError, AuditEntry, Job
from asyncq.errors import StoreError
from asyncq.store.port.queue import JobFilter, StoreState
from asyncq.store.port.reports import BackupReport, PruneReport, StoreDescription
from asyncq.store.sqlite.connection import check_path, write_transaction
from asyncq.store.sqlite.graph_schema import NEEDED_BY_GRAPH, REMOVE_EDGES
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.store.sqlite.schema import ENDED_AT, PRODUCT

_JOBS, _AUDIT = PRODUCT.jobs, PRODUCT.audit
JOB_COLUMNS = (
    "seq, id, queue, body, status, attempts, max_attempts, token, available_at, deadline, owner, lease_until, reason"
)
_REDRIVES = f"(SELECT count(*) FROM {_AUDIT} a WHERE a.job_seq = j.seq AND a.action = 'redrive') AS redrives"
#: What a job record has after its columns: its redrive count, its priority, a cancel request not yet carried out,
#: its unique key, its task, its group, how many dependencies it still waits for, and its limit key.
JOB_EXTRAS = f"{_REDRIVES}, j.priority, j.cancel_requested_at, j.unique_key, j.task, j.group_name, j.waits, j.limit_key"
_FILTERS = (
    "(:status IS NULL OR status = :status) AND (:queue IS NULL OR queue = :queue)"
    " AND (:reason IS NULL OR reason = :reason)"
)
LIST_OLDEST = (
    f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {_JOBS} j WHERE seq > :after AND {_FILTERS} ORDER BY seq LIMIT :limit"
)
LIST_NEWEST = f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {_JOBS} j WHERE {_FILTERS} ORDER BY seq DESC LIMIT :limit"
# Leased and dead jobs are listed from their status's partial index (O(leased), and O(limit) newest first for dead),
# not by walking the table: a dashboard lists both on every refresh, and a deep queue holds millions of pending rows
# before the first of them. ``INDEXED BY`` names the index (the planner prefers the rowid walk of ``seq > :after``).
# Pending, done and any-status listings walk the table in ``seq`` order: at depth, most rows are their answer.
_BY_INDEX = {"leased": f"{_JOBS}_leased", "dead": f"{_JOBS}_dead"}
LIST_INDEXED = {
    (status, newest): f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {_JOBS} j INDEXED BY {index} WHERE status = '{status}'"
    f" AND {_FILTERS} {'ORDER BY seq DESC' if newest else 'AND seq > :after ORDER BY seq'} LIMIT :limit"
    for status, index in _BY_INDEX.items()
    for newest in (False, True)
} | {  # waiting jobs: from the index of jobs with edges not met (``graph_schema``), whose WHERE is repeated here
    ("waiting", newest): f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {_JOBS} j INDEXED BY {_JOBS}_waits WHERE waits > 0"
    f" AND status = 'waiting' AND {_FILTERS} {'ORDER BY seq DESC' if newest else 'AND seq > :after ORDER BY seq'}"
    " LIMIT :limit"
    for newest in (False, True)
}
GET_JOB = f"SELECT {JOB_COLUMNS}, {JOB_EXTRAS} FROM {_JOBS} j WHERE id = :id"
AUDIT_COLUMNS = "seq, id, action, token, at_ms, note, reason, op_seq"
HISTORY = f"SELECT {AUDIT_COLUMNS} FROM {_AUDIT} WHERE id = :id ORDER BY seq"
AUDIT_LOG = f"SELECT {AUDIT_COLUMNS} FROM {_AUDIT} ORDER BY seq DESC LIMIT :limit"
LAST_AUDIT_OF = f"SELECT {AUDIT_COLUMNS} FROM {_AUDIT} WHERE id = :id ORDER BY seq DESC LIMIT 1"
COUNT_BY_STATUS = f"SELECT status, count(*) FROM {_JOBS} GROUP BY status"
ERRORS_OF = f"SELECT attempt, at_ms, type, message, traceback FROM {PRODUCT.errors} WHERE job_seq = ? ORDER BY seq"
LAST_ERRORS = f"""SELECT e.job_seq, e.attempt, e.at_ms, e.type, e.message, e.traceback FROM {PRODUCT.errors} e
WHERE e.seq IN (SELECT max(seq) FROM {PRODUCT.errors} WHERE job_seq IN (SELECT value FROM json_each(?))
GROUP BY job_seq)"""

# When a finished job ended (``schema.ENDED_AT``: finish and cancel stamp ``available_at = now``; the sweep stamps
# nothing, and a row with reason deadline or exhausted does not say which of them parked it, so those are dated by
# their deadline: never before they ended, except a job the sweep parked after its deadline).
_PRUNABLE = (
    f"((:done AND status = 'done') OR (:dead AND status = 'dead')) AND {ENDED_AT} < :cutoff AND NOT {NEEDED_BY_GRAPH}"
)
PRUNABLE_COUNTS = f"SELECT status, count(*) FROM {_JOBS} j WHERE {_PRUNABLE} GROUP BY status"
PRUNABLE_IDS = f"SELECT id FROM {_JOBS} j WHERE {_PRUNABLE} ORDER BY seq LIMIT :limit"
PRUNABLE_SEQS = f"SELECT seq FROM {_JOBS} j WHERE {_PRUNABLE}"
# Removing finished jobs, shared by prune and retention: their errors and results go with them, audit rows stay.
# The job's own delete re-checks that it has ended, so a row redriven since it was chosen is never removed.
_SEQS = "(SELECT value FROM json_each(:seqs))"
REMOVE_JOBS = (
    *REMOVE_EDGES,
    f"DELETE FROM {PRODUCT.errors} WHERE job_seq IN {_SEQS}",
    f"DELETE FROM {PRODUCT.results} WHERE job_seq IN {_SEQS}",
    f"DELETE FROM {_JOBS} WHERE seq IN {_SEQS} AND status IN ('done', 'dead')",
)
REMOVE_CHUNK = 10_000  # seqs per statement of a prune (a JSON array each)
RESULT_OF = f"SELECT value FROM {PRODUCT.results} WHERE job_seq = ?"
# A result alone once its retention is over (its job stays, without it, until its own prune).
PRUNE_EXPIRED_RESULTS = f"DELETE FROM {PRODUCT.results} WHERE expires_at <= :now"

AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}


@dataclass(frozen=True)
class QueueFile:
    """What a file turned out to be when it was opened."""

    path: str
    journal_mode: str
    schema_version: int
    auto_vacuum: str

    @property
    def durability(self) -> str:
        """The durability that keeps the file's journal mode."""
        return "full-delete" if self.journal_mode == "delete" else "full"


def existing_file(path: object, name: str = "path") -> str:
    """``path`` if it names an existing regular file (``StoreError`` otherwise: nothing is created)."""
    file = check_path(path, name)
    if not os.path.exists(file):
        raise StoreError(f"no such queue file: {file}")
    if not os.path.isfile(file):
        raise StoreError(f"{file} is not a regular file")
    return file


def read_only_uri(path: str, *, immutable: bool = False) -> str:
    """The ``mode=ro`` URI of an existing file: a connection to it can neither create nor change it."""
    return Path(existing_file(path)).absolute().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


SIDE_FILES = ("-wal", "-shm", "-journal")


def may_open_immutable(path: str) -> bool:
    """Whether a reader may treat ``path`` as immutable: its directory is not writable to us and it has no side
    files, so no writer can be at work on it (a WAL writer needs ``-wal`` and ``-shm`` beside it)."""
    folder = os.path.dirname(os.path.abspath(path))
    return not os.access(folder, os.W_OK) and not any(os.path.exists(path + side) for side in SIDE_FILES)


def read_only_part(path: str) -> str | None:
    """What keeps ``path`` from being written, and what to do: the file, a side file (``-wal``/``-shm``/``-journal``,
    which SQLite creates with the file's mode, so they stay read-only after the file is made writable again), or
    its directory; ``None`` if all of them are writable."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its directory {folder} does not exist"
    if _not_writable(path):
        return "the file is read-only: make it writable (chmod u+w) to change the queue"
    for side in SIDE_FILES:
        if _not_writable(path + side):
            return (
                f"its side file {os.path.basename(path + side)} is read-only: make it writable, or delete it while"
                " no process has the queue open"
            )
    if not os.access(folder, os.W_OK):
        return f"its directory {folder} is not writable: SQLite creates its journal files beside the queue"
    return None


def _not_writable(path: str) -> bool:
    """``path`` exists and cannot be written. Side files come and go as other processes open and close the queue
    (the last connection of a WAL file removes -wal and -shm, the next one creates them), and ``os.access`` says
    no to a file that is absent as to one that is read-only: a refusal counts only when the file was there both
    before and after a second refusal, so a side file created between two checks is not taken for read-only."""
    return (
        not os.access(path, os.W_OK) and os.path.exists(path) and not os.access(path, os.W_OK) and os.path.exists(path)
    )


def connect_read_only(path: str, timeout: float) -> sqlite3.Connection:
    """A read-only connection to an existing file; a closed WAL file in a directory we cannot write is read
    ``immutable`` (``may_open_immutable``), and a file we cannot read at all is a ``StoreError`` saying why."""
    con = sqlite3.connect(read_only_uri(path), uri=True, isolation_level=None, timeout=timeout)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # SQLite opens lazily: fail here, not later
        return con
    except sqlite3.OperationalError as error:
        con.close()
        if may_open_immutable(path):
            return sqlite3.connect(read_only_uri(path, immutable=True), uri=True, isolation_level=None, timeout=timeout)
        blocker = read_only_part(path)
        if blocker is None:
            raise
        raise StoreError(f"{path}: {blocker}") from error
    except sqlite3.DatabaseError as error:
        con.close()
        raise StoreError(f"{path} is not a SQLite database ({error})") from None


def inspect(con: sqlite3.Connection, path: str, *, table: str | None = _JOBS) -> QueueFile:
    """What ``con``'s file is; ``StoreError`` unless it is a SQLite file (holding ``table``, if named)."""
    try:
        version = int(con.execute("PRAGMA user_version").fetchone()[0])
        found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table or "",)).fetchone()
        mode = str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        vacuum = AUTO_VACUUM.get(int(con.execute("PRAGMA auto_vacuum").fetchone()[0]), "unknown")
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as error:
        raise StoreError(f"{path} is not a SQLite database ({error})") from None
    if table is not None and found is None:
        if table == _JOBS:
            raise StoreError(f"{path} is not an asyncq queue (it has no queue tables; `asyncq init` adds them)")
        raise StoreError(f"{path} is not an asyncq inbox (it has no {table} table)")
    return QueueFile(path, mode, version, vacuum)


def check_version(file: QueueFile, *, writing: bool) -> None:
    """Refuse a file of a newer asyncq; readers also refuse an older one (``asyncq init`` migrates it)."""
    if file.schema_version > SCHEMA_VERSION:
        raise StoreError(f"{file.path} has schema version {file.schema_version}, newer than this asyncq's")
    if file.schema_version < SCHEMA_VERSION and not writing:
        raise StoreError(f"{file.path} has schema version {file.schema_version}: run `asyncq init` to migrate it")


@contextmanager
def snapshot(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction, so that several statements see the same state of the file."""
    con.execute("BEGIN")
    try:
        yield con
    finally:
        con.execute("COMMIT")


def _job(row: Sequence[Any], body: bool = True) -> Job:
    job = Job.from_row(tuple(row))
    return job if body else _without_body(job)


def _without_body(job: Job) -> Job:
    return replace(job, body=None)


def get_job(con: sqlite3.Connection, job_id: str) -> Job | None:
    """One job with its redrive count and every failed attempt's error, or ``None`` (one snapshot)."""
    with snapshot(con):
        row = con.execute(GET_JOB, {"id": job_id}).fetchone()
        errors = [] if row is None else con.execute(ERRORS_OF, (row[0],)).fetchall()
        result = None if row is None else con.execute(RESULT_OF, (row[0],)).fetchone()
    if row is None:
        return None
    found = tuple(AttemptError(*error) for error in errors)
    return replace(_job(row), errors=found, result_json=None if result is None else result[0])


def list_jobs(con: sqlite3.Connection, which: JobFilter) -> list[Job]:
    """Jobs matching ``which``, oldest first from ``after`` (or newest first)."""
    params: dict[str, object] = {"status": which.status, "queue": which.queue, "reason": which.reason}
    params |= {"after": which.after, "limit": which.limit}
    with snapshot(con):
        rows = con.execute(_listing(which), params).fetchall()
        last = last_errors(con, [row[0] for row in rows]) if which.errors and rows else {}
    jobs = [_job(row, which.body) for row in rows]
    return [replace(job, errors=(last[job.seq],)) if job.seq in last else job for job in jobs]


def _listing(which: JobFilter) -> str:
    """The listing statement for ``which``: its status's index where it has one (``LIST_INDEXED``)."""
    indexed = LIST_INDEXED.get((which.status or "", which.newest))
    if indexed is not None:
        return indexed
    return LIST_NEWEST if which.newest else LIST_OLDEST


def last_errors(con: sqlite3.Connection, seqs: list[int]) -> dict[int, AttemptError]:
    """The newest error of each job in ``seqs`` that has one."""
    rows = con.execute(LAST_ERRORS, (json.dumps(seqs),)).fetchall()
    return {row[0]: AttemptError(*row[1:]) for row in rows}


def history(con: sqlite3.Connection, job_id: str) -> list[AuditEntry]:
    """One job's audit rows, oldest first."""
    return [AuditEntry(*row) for row in con.execute(HISTORY, {"id": job_id})]


def audit_log(con: sqlite3.Connection, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` audit rows, newest first."""
    return [AuditEntry(*row) for row in con.execute(AUDIT_LOG, {"limit": limit})]


def last_audit_of(con: sqlite3.Connection, job_id: str) -> AuditEntry:
    """The audit row just written for ``job_id`` (inside the transaction that wrote it)."""
    return AuditEntry(*con.execute(LAST_AUDIT_OF, {"id": job_id}).fetchone())


def prune_params(cutoff_ms: int, statuses: Sequence[str], limit: int = -1) -> dict[str, Any]:
    """The parameters of the prune statements."""
    return {"cutoff": cutoff_ms, "done": "done" in statuses, "dead": "dead" in statuses, "limit": limit}


def prunable(con: sqlite3.Connection, params: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Counts by status of the jobs a prune would delete, and the first ``limit`` of their ids."""
    with snapshot(con):
        counts = {str(status): int(n) for status, n in con.execute(PRUNABLE_COUNTS, params)}
        ids = [str(job_id) for (job_id,) in con.execute(PRUNABLE_IDS, params)]
    return {status: counts.get(status, 0) for status in ("done", "dead")}, ids


def prune(con: sqlite3.Connection, path: str, params: dict[str, Any], *, vacuum: bool) -> PruneReport:
    """Delete the prunable jobs in one transaction (audit rows stay), then give the space back."""
    size = os.path.getsize(path)
    with write_transaction(con):
        seqs = [seq for (seq,) in con.execute(PRUNABLE_SEQS, params)]
        deleted = sum(remove_jobs(con, seqs[at : at + REMOVE_CHUNK]) for at in range(0, len(seqs), REMOVE_CHUNK))
        con.execute(PRUNE_EXPIRED_RESULTS, params)
    free = int(con.execute("PRAGMA freelist_count").fetchone()[0])
    auto_vacuum = AUTO_VACUUM.get(int(con.execute("PRAGMA auto_vacuum").fetchone()[0]), "unknown")
    if auto_vacuum == "incremental":
        con.executescript("PRAGMA incremental_vacuum;")  # steps it to the end; execute() frees one page
        done: Literal["incremental", "full", "skipped"] = "incremental"
    elif vacuum:
        con.executescript("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")  # later prunes need no VACUUM
        done = "full"
    else:
        done = "skipped"
    if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    # bytes_after: the store adds it once the checkpoint has run
    return {"deleted": deleted, "free_pages": free, "vacuum": done, "bytes_before": size, "bytes_after": size}


def remove_jobs(con: sqlite3.Connection, seqs: Sequence[int]) -> int:
    """Delete the ended jobs among ``seqs`` with their errors and results, inside the caller's write transaction;
    how many jobs."""
    params = {"seqs": json.dumps(list(seqs))}
    for statement in REMOVE_JOBS[:-1]:
        con.execute(statement, params)
    return int(con.execute(REMOVE_JOBS[-1], params).rowcount)


def backup(con: sqlite3.Connection, path: str, target: str, *, force: bool) -> BackupReport:
    """Copy the queue with SQLite's online backup (one consistent snapshot, writers keep going) to a temporary
    file beside ``target``, check it, and rename it into place. An existing directory as ``target`` receives a
    file of the queue's name."""
    destination = check_path(target, "PATH")
    if os.path.isdir(destination):
        destination = os.path.join(destination, os.path.basename(path))
    if os.path.exists(destination) and not force:
        raise StoreError(f"{destination} exists (use --force to replace it)")
    if os.path.exists(destination) and os.path.samefile(destination, path):
        raise StoreError("the backup must not be the queue file itself")
    partial = os.path.join(os.path.dirname(os.path.abspath(destination)), f".{os.path.basename(destination)}.partial")
    try:
        with closing(sqlite3.connect(partial)) as copy:
            con.backup(copy)
            pages, page_size, check, jobs = check_copy(copy)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, destination)
        _sync_directory(os.path.dirname(partial))
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    size = os.path.getsize(destination)
    return {"path": destination, "bytes": size, "pages": pages, "page_size": page_size, "check": check, "jobs": jobs}


def _sync_directory(path: str) -> None:
    """Make a rename in ``path`` durable (the directory entry reaches the disk)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def check_copy(con: sqlite3.Connection) -> tuple[int, int, str, dict[str, int]]:
    """A fresh copy's size in pages, page size, integrity and job counts; ``StoreError`` if SQLite finds damage."""
    check = str(con.execute("PRAGMA quick_check").fetchone()[0])
    if check != "ok":
        raise StoreError(f"the backup failed its integrity check: {check}")
    pages = int(con.execute("PRAGMA page_count").fetchone()[0])
    page_size = int(con.execute("PRAGMA page_size").fetchone()[0])
    counts = {str(status): int(n) for status, n in con.execute(COUNT_BY_STATUS)}
    return pages, page_size, check, counts


def describe(con: sqlite3.Connection, path: str) -> StoreDescription:
    """The file's kind, path and settings."""
    file = inspect(con, path)
    return {
        "store": "sqlite",
        "path": path,
        "schema_version": file.schema_version,
        "journal_mode": file.journal_mode,
        "auto_vacuum": file.auto_vacuum,
        "survives_power_loss": True,  # the store says it from the level it opened the file at
    }


NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "davfs"}
)


def filesystem_type(path: str, mounts: str) -> str:
    """The type of the file system holding ``path``, from a ``/proc/self/mounts`` text ("" if unknown)."""
    where = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def on_network_filesystem(path: str) -> str | None:
    """The network file system type ``path`` lives on (``None`` if local or unknown)."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    kind = filesystem_type(path, mounts)
    return kind if kind in NETWORK_FILESYSTEMS or kind.startswith("fuse.sshfs") else None


def inspect_target(path: object, timeout: float) -> StoreState:
    """What ``path`` holds, read-only (a missing file is reported, never created); ``StoreError`` if it is not a
    regular file or not a SQLite database."""
    file = check_path(path)
    network = on_network_filesystem(file)
    if not os.path.lexists(file):
        return StoreState(file, "missing", 0, SCHEMA_VERSION, {"network_filesystem": network})
    with closing(connect_read_only(file, timeout)) as con:
        found = inspect(con, file, table=None)
        tables = {str(name) for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    kind = "queue" if _JOBS in tables else "other" if tables else "empty"
    settings = {"journal_mode": found.journal_mode, "auto_vacuum": found.auto_vacuum, "network_filesystem": network}
    return StoreState(file, kind, found.schema_version, SCHEMA_VERSION, settings)
