"""The operator's direct access to a queue file, below the ``asyncq`` command.

Reads open the file read-only (``mode=ro``): they never create it and never change it. SQLite may create
the empty ``-wal`` and ``-shm`` side files of a WAL file, which belong to it (never delete them).

Every lifecycle change (enqueue, redrive, cancel) goes through ``Queue``; only the two maintenance
operations with no lifecycle meaning live here: deleting finished jobs past their retention, and SQLite's
online backup. Statements are named here once, beside their only user.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncq.core.jobs import Job
from asyncq.store.sqlite.connection import check_path, write_transaction
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.store.sqlite.schema import PRODUCT

_JOBS, _AUDIT = PRODUCT.jobs, PRODUCT.audit
_FILTERS = (
    "(:status IS NULL OR status = :status) AND (:queue IS NULL OR queue = :queue)"
    " AND (:reason IS NULL OR reason = :reason)"
)
_REDRIVES = f"(SELECT count(*) FROM {_AUDIT} a WHERE a.id = j.id AND a.action = 'redrive') AS redrives"

LIST_OLDEST = (
    f"SELECT {Job.COLUMNS}, {_REDRIVES} FROM {_JOBS} j WHERE seq > :after AND {_FILTERS} ORDER BY seq LIMIT :limit"
)
LIST_NEWEST = f"SELECT {Job.COLUMNS}, {_REDRIVES} FROM {_JOBS} j WHERE {_FILTERS} ORDER BY seq DESC LIMIT :limit"
GET_JOB = f"SELECT {Job.COLUMNS}, {_REDRIVES} FROM {_JOBS} j WHERE id = :id"
HISTORY = f"SELECT seq, action, token, at_ms, note, reason FROM {_AUDIT} WHERE id = :id ORDER BY seq"
DEAD_BY_REASON = f"SELECT reason, count(*) FROM {_JOBS} WHERE status = 'dead' GROUP BY reason ORDER BY reason"
REDRIVABLE = f"""SELECT id, queue, token, reason FROM {_JOBS}
WHERE status = 'dead' AND reason = :reason AND (:queue IS NULL OR queue = :queue) ORDER BY seq LIMIT :limit"""
DEAD_OR_NOT = f"SELECT id, queue, token, reason, status FROM {_JOBS} WHERE id = :id"
LAST_AUDIT = f"SELECT coalesce(max(seq), 0) FROM {_AUDIT}"
AUDIT_SINCE = f"SELECT seq, id, token, at_ms, note, action FROM {_AUDIT} WHERE seq > :after ORDER BY seq"
COUNT_BY_STATUS = f"SELECT status, count(*) FROM {_JOBS} GROUP BY status"

# When a finished job ended. Finish and cancel stamp ``available_at = now``; the sweep stamps nothing, and a row
# with reason deadline or exhausted does not say which of them parked it, so those are dated by their deadline:
# never before they ended, except a job the sweep parked after its deadline (then the earliest it could have).
_ENDED_AT = "CASE WHEN status = 'done' OR reason IN ('permanent', 'cancelled') THEN available_at ELSE deadline END"
_PRUNABLE = f"((:done AND status = 'done') OR (:dead AND status = 'dead')) AND {_ENDED_AT} < :cutoff"
PRUNABLE_COUNTS = f"SELECT status, count(*) FROM {_JOBS} WHERE {_PRUNABLE} GROUP BY status"
PRUNABLE_IDS = f"SELECT id FROM {_JOBS} WHERE {_PRUNABLE} ORDER BY seq LIMIT :limit"
PRUNE = f"DELETE FROM {_JOBS} WHERE {_PRUNABLE}"

AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}


class CliError(Exception):
    """A failure reported on one line, without a traceback; ``code`` is the exit status."""

    code = 1


class UsageError(CliError):
    """A command line that cannot work, found after parsing (exit status 2)."""

    code = 2


@dataclass(frozen=True)
class QueueFile:
    """What a file turned out to be when it was opened."""

    path: str
    journal_mode: str
    schema_version: int
    auto_vacuum: str

    @property
    def durability(self) -> str:
        """The ``Queue`` durability that keeps the file's journal mode (``Queue.open`` sets it)."""
        return "full-delete" if self.journal_mode == "delete" else "full"


def existing_file(path: str) -> str:
    """``path`` if it names an existing regular file (``CliError`` otherwise: nothing is created)."""
    file = check_path(path, "--db")
    if not os.path.exists(file):
        raise CliError(f"no such queue file: {file}")
    if not os.path.isfile(file):
        raise CliError(f"{file} is not a regular file")
    return file


def connect_read_only(path: str, timeout: float) -> sqlite3.Connection:
    """A ``mode=ro`` connection to an existing file: it can neither create nor change the file."""
    uri = Path(existing_file(path)).absolute().as_uri() + "?mode=ro"
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout)


def inspect(con: sqlite3.Connection, path: str, *, table: str | None = _JOBS) -> QueueFile:
    """What ``con``'s file is; ``CliError`` unless it is a SQLite file (holding ``table``, if named)."""
    try:
        version = int(con.execute("PRAGMA user_version").fetchone()[0])
        found = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table or "",)).fetchone()
        mode = str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        vacuum = AUTO_VACUUM.get(int(con.execute("PRAGMA auto_vacuum").fetchone()[0]), "unknown")
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as error:
        raise CliError(f"{path} is not a SQLite database ({error})") from None
    if table is not None and found is None:
        kind = "an asyncq queue" if table == _JOBS else "an asyncq inbox"
        raise CliError(f"{path} is not {kind} (it has no {table} table)")
    return QueueFile(path, mode, version, vacuum)


def check_version(file: QueueFile, *, writing: bool) -> None:
    """Refuse a file of a newer asyncq; readers also refuse an older one (``asyncq init`` migrates it)."""
    if file.schema_version > SCHEMA_VERSION:
        raise CliError(f"{file.path} has schema version {file.schema_version}, newer than this asyncq's")
    if file.schema_version < SCHEMA_VERSION and not writing:
        raise CliError(f"{file.path} has schema version {file.schema_version}: run `asyncq init` to migrate it")


@contextmanager
def reading(path: str, timeout: float) -> Iterator[tuple[sqlite3.Connection, QueueFile]]:
    """An existing queue file, opened read-only, and what it is."""
    with closing(connect_read_only(path, timeout)) as con:
        file = inspect(con, path)
        check_version(file, writing=False)
        yield con, file


def probe_for_writing(path: str, timeout: float) -> QueueFile:
    """Check, read-only, that ``path`` is a queue a write command may open (it must exist already)."""
    with closing(connect_read_only(path, timeout)) as con:
        file = inspect(con, path)
    check_version(file, writing=True)
    return file


@contextmanager
def snapshot(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction, so that several statements see the same state of the file."""
    con.execute("BEGIN")
    try:
        yield con
    finally:
        con.execute("COMMIT")


def job_record(row: tuple[Any, ...], *, body: bool) -> dict[str, Any]:
    """A listed row (``Job.COLUMNS`` then ``redrives``) as the JSON object the command prints."""
    record = asdict(Job.from_row(row[:-1]))
    if not body:
        del record["body"]
    return record | {"redrives": int(row[-1])}


def list_jobs(con: sqlite3.Connection, filters: dict[str, Any], *, newest: bool, body: bool) -> list[dict[str, Any]]:
    """Jobs matching ``filters`` (status, queue, reason, after, limit), oldest or newest first."""
    rows = con.execute(LIST_NEWEST if newest else LIST_OLDEST, filters).fetchall()
    return [job_record(tuple(row), body=body) for row in rows]


def read_job(con: sqlite3.Connection, job_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """One job with its body, and its audit history (redrives and cancels), or ``None``; one snapshot."""
    with snapshot(con):
        row = con.execute(GET_JOB, {"id": job_id}).fetchone()
        history = con.execute(HISTORY, {"id": job_id}).fetchall()
    if row is None:
        return None
    names = ("seq", "action", "token", "at_ms", "note", "reason")
    return job_record(tuple(row), body=True), [dict(zip(names, entry, strict=True)) for entry in history]


def dead_by_reason(con: sqlite3.Connection) -> dict[str, int]:
    """How many dead jobs each reason holds."""
    return {str(reason): int(count) for reason, count in con.execute(DEAD_BY_REASON)}


def redrivable(con: sqlite3.Connection, reason: str, queue: str | None, limit: int) -> list[dict[str, Any]]:
    """Dead jobs with ``reason`` (in ``queue``), oldest first, at most ``limit`` (``-1``: all)."""
    rows = con.execute(REDRIVABLE, {"reason": reason, "queue": queue, "limit": limit}).fetchall()
    return [{"id": i, "queue": q, "token": t, "reason": r} for i, q, t, r in rows]


def dead_jobs_named(con: sqlite3.Connection, ids: list[str]) -> list[dict[str, Any]]:
    """The named jobs, which must all exist and be dead (``CliError`` naming the first that is not)."""
    jobs = []
    for job_id in ids:
        row = con.execute(DEAD_OR_NOT, {"id": job_id}).fetchone()
        if row is None or row[4] != "dead":
            raise CliError(f"job {job_id!r} is {'missing' if row is None else row[4] + ', not dead'}: nothing redriven")
        jobs.append({"id": row[0], "queue": row[1], "token": row[2], "reason": row[3]})
    return jobs


def last_audit_seq(con: sqlite3.Connection) -> int:
    """The newest audit row's ``seq`` (0 when there is none)."""
    return int(con.execute(LAST_AUDIT).fetchone()[0])


def audit_since(con: sqlite3.Connection, after: int) -> list[dict[str, Any]]:
    """Audit rows written after ``seq = after``, in order."""
    names = ("seq", "id", "token", "at_ms", "note", "action")
    return [dict(zip(names, row, strict=True)) for row in con.execute(AUDIT_SINCE, {"after": after})]


def inbox_totals(path: str, timeout: float) -> dict[str, Any]:
    """A receiver's durable counts (rows applied, duplicates, conflicts), read-only."""
    from asyncq.store.sqlite.inbox import TOTALS  # the receiver's statement, stated once there

    with closing(connect_read_only(path, timeout)) as con:
        inspect(con, path, table="asyncq_inbox")
        applied, duplicates, conflicts = con.execute(TOTALS).fetchone()
    return {"file": path, "applied": applied, "duplicates": duplicates, "conflicts": conflicts}


def prune_params(cutoff_ms: int, statuses: tuple[str, ...], limit: int = -1) -> dict[str, Any]:
    """The parameters of the prune statements."""
    return {"cutoff": cutoff_ms, "done": "done" in statuses, "dead": "dead" in statuses, "limit": limit}


def prunable(con: sqlite3.Connection, params: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Counts by status of the jobs a prune would delete, and the first ``limit`` of their ids."""
    with snapshot(con):
        counts = {str(status): int(n) for status, n in con.execute(PRUNABLE_COUNTS, params)}
        ids = [str(job_id) for (job_id,) in con.execute(PRUNABLE_IDS, params)]
    return {status: counts.get(status, 0) for status in ("done", "dead")}, ids


def connect_for_writing(file: QueueFile, timeout: float) -> sqlite3.Connection:
    """A read-write connection with the synchronous level asyncq states durability for."""
    con = sqlite3.connect(file.path, isolation_level=None, timeout=timeout)
    con.execute(f"PRAGMA synchronous={'EXTRA' if file.journal_mode == 'delete' else 'FULL'}")
    return con


def prune(file: QueueFile, params: dict[str, Any], *, vacuum: bool, timeout: float) -> dict[str, Any]:
    """Delete the prunable jobs in one transaction (audit rows stay), then give the space back."""
    size = os.path.getsize(file.path)
    with closing(connect_for_writing(file, timeout)) as con:
        with write_transaction(con):
            deleted = con.execute(PRUNE, params).rowcount
        free = int(con.execute("PRAGMA freelist_count").fetchone()[0])
        if file.auto_vacuum == "incremental":
            con.executescript("PRAGMA incremental_vacuum;")  # steps it to the end; execute() frees one page
            done = "incremental"
        elif vacuum:
            con.executescript("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")  # later prunes need no VACUUM
            done = "full"
        else:
            done = "skipped"
        if file.journal_mode == "wal":
            con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return {
        "deleted": deleted,
        "free_pages": free,
        "vacuum": done,
        "bytes_before": size,
        "bytes_after": os.path.getsize(file.path),
    }


def backup(file: QueueFile, target: str, *, force: bool, timeout: float) -> dict[str, Any]:
    """Copy the queue with SQLite's online backup (one consistent snapshot, writers keep going) to a
    temporary file beside ``target``, check it, and rename it into place."""
    destination = check_path(target, "PATH")
    if os.path.exists(destination) and not force:
        raise CliError(f"{destination} exists (use --force to replace it)")
    if os.path.exists(destination) and os.path.samefile(destination, file.path):
        raise CliError("the backup must not be the queue file itself")
    partial = os.path.join(os.path.dirname(os.path.abspath(destination)), f".{os.path.basename(destination)}.partial")
    try:
        with closing(connect_read_only(file.path, timeout)) as source, closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)
            report = check_copy(copy)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, destination)
        _sync_directory(os.path.dirname(partial))
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return {"path": destination, "bytes": os.path.getsize(destination)} | report


def _sync_directory(path: str) -> None:
    """Make a rename in ``path`` durable (the directory entry reaches the disk)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def check_copy(con: sqlite3.Connection) -> dict[str, Any]:
    """A fresh copy's integrity, size in pages, and job counts; ``CliError`` if SQLite finds damage."""
    check = str(con.execute("PRAGMA quick_check").fetchone()[0])
    if check != "ok":
        raise CliError(f"the backup failed its integrity check: {check}")
    pages = int(con.execute("PRAGMA page_count").fetchone()[0])
    page_size = int(con.execute("PRAGMA page_size").fetchone()[0])
    counts = {str(status): int(n) for status, n in con.execute(COUNT_BY_STATUS)}
    return {"pages": pages, "page_size": page_size, "check": check, "jobs": counts}


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
