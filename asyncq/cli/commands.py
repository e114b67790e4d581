"""The bodies of the ``asyncq`` subcommands that read or change a queue file (``work`` and ``serve-inbox``
are in ``asyncq.cli.work``). Each takes the parsed arguments and returns a ``Report``: the data that
``--json`` prints and the text a person reads.

Reads open the file read-only (``asyncq.store.sqlite.admin``). Every lifecycle change goes through ``Queue``, so its
rules live in one place; write commands first check, read-only, that the file is a queue, and open it with
the durability that keeps its journal mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from asyncq.cli import output as out
from asyncq.core.clock import wall_clock_ms
from asyncq.core.jobs import JobSpec
from asyncq.errors import Conflict
from asyncq.queue import Queue
from asyncq.store.sqlite import admin as store
from asyncq.store.sqlite.admin import CliError, QueueFile, UsageError
from asyncq.store.sqlite.connection import check_path
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import read_stats

ENQUEUE_BATCH = 500
LINE_KEYS = frozenset({"id", "body", "queue", "max_attempts", "ttl_ms", "delay_ms"})


@dataclass(frozen=True)
class Report:
    """What a command found or did: ``data`` for ``--json``, ``text`` for a person, and the exit status."""

    data: dict[str, Any]
    text: str
    code: int = 0


def report(data: dict[str, Any], render: Callable[[dict[str, Any]], str], code: int = 0) -> Report:
    """A ``Report`` whose text is ``render(data)``."""
    return Report(data, render(data), code)


async def _open(file: QueueFile, timeout: float) -> Queue:
    return await Queue.open(file.path, durability=file.durability, busy_timeout=timeout)


# -- init -----------------------------------------------------------------------------------------------


def init(args: argparse.Namespace) -> Report:
    """Create a queue file (``Queue.open`` makes new files ``auto_vacuum=INCREMENTAL``), or bring an existing
    SQLite file to the schema."""
    path = check_path(args.db, "--db")
    network = store.on_network_filesystem(path)
    if network is not None:
        raise CliError(f"{path} is on a {network} file system, where SQLite's locks are unreliable: use a local disk")
    created = not os.path.exists(path) or (os.path.isfile(path) and os.path.getsize(path) == 0)
    durability = args.durability
    if not created:
        with closing(store.connect_read_only(path, args.timeout)) as con:
            found = store.inspect(con, path, table=None)
        store.check_version(found, writing=True)
        durability = durability or found.durability
    asyncio.run(_open_and_close(path, durability or "full", args.timeout))
    with store.reading(path, args.timeout) as (_con, file):
        data = {"path": path, "created": created, "schema_version": file.schema_version}
        data |= {"journal_mode": file.journal_mode, "auto_vacuum": file.auto_vacuum}
    return report(data, out.render_init)


async def _open_and_close(path: str, durability: str, timeout: float) -> None:
    queue = await Queue.open(path, durability=durability, busy_timeout=timeout)
    await queue.close()


# -- enqueue --------------------------------------------------------------------------------------------


def enqueue(args: argparse.Namespace) -> Report:
    """One job from the arguments, or one per JSON line on stdin, in transactions of 500."""
    defaults = {"queue": args.queue, "max_attempts": args.max_attempts, "ttl_ms": args.ttl, "delay_ms": args.delay}
    if args.id is not None:
        if args.body is None:
            raise UsageError("give the job's BODY (JSON) after its ID")
        specs = [checked_spec(defaults | {"id": args.id, "body": args.body}, "the arguments")]
    elif sys.stdin.isatty():
        raise UsageError("give ID BODY, or pipe JSON lines on stdin")
    else:
        specs = read_specs(sys.stdin, defaults)
    file = store.probe_for_writing(args.db, args.timeout)
    progress = None
    if len(specs) > 1 and sys.stderr.isatty():
        progress = out.ProgressBar(len(specs), sys.stderr)
    added = asyncio.run(_enqueue_all(file, specs, args.timeout, progress))
    data = {"path": file.path, "added": added, "unchanged": len(specs) - added, "total": len(specs)}
    return report(data, out.render_enqueue)


def checked_spec(fields: dict[str, Any], where: str) -> JobSpec:
    """A job spec whose every field has been checked as ``enqueue`` will check it."""
    spec = JobSpec(**fields)
    try:
        spec.to_row(wall_clock_ms())
    except ValueError as error:
        raise CliError(f"{where}: {error}") from None
    return spec


def read_specs(lines: Iterable[str], defaults: dict[str, Any]) -> list[JobSpec]:
    """Every line checked before anything is written: ``{"id", "body"}`` and optionally ``queue``,
    ``max_attempts``, ``ttl_ms``, ``delay_ms`` (the options give the defaults); blank lines skipped."""
    specs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"stdin line {number}"
        try:
            item = json.loads(line)
        except ValueError as error:
            raise CliError(f"{where} is not JSON: {error}") from None
        if type(item) is not dict or not {"id", "body"} <= item.keys() or not item.keys() <= LINE_KEYS:
            raise CliError(f"{where} must be an object with id and body, and only {sorted(LINE_KEYS)}")
        specs.append(checked_spec(defaults | item, where))
    return specs


async def _enqueue_all(file: QueueFile, specs: list[JobSpec], timeout: float, bar: out.ProgressBar | None) -> int:
    added = 0
    async with await _open(file, timeout) as queue:
        for start in range(0, len(specs), ENQUEUE_BATCH):
            batch = specs[start : start + ENQUEUE_BATCH]
            try:
                added += sum(await queue.enqueue_many(batch))
            except Conflict as error:
                if len(specs) == 1:
                    raise
                raise CliError(
                    f"{error}: jobs {start + 1}-{start + len(batch)} were not written, the {start} before them were "
                    "(enqueueing the same id and body again changes nothing, so fix the input and run it again)"
                ) from None
            if bar is not None:
                bar.show(start + len(batch))
    if bar is not None:
        bar.close()
    return added


# -- reads ----------------------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> Report:
    """Counts by status and dead reason, the oldest ready job's wait, attempts, leases by owner."""
    with store.reading(args.db, args.timeout) as (con, file):
        stats = read_stats(con, PRODUCT, wall_clock_ms())
    data: dict[str, Any] = {"path": file.path, "now_ms": stats.now_ms, "total": stats.total}
    data |= {"by_status": stats.by_status, "dead_by_reason": dict(sorted(stats.dead_by_reason.items()))}
    data["oldest_pending_age_ms"] = stats.oldest_ready_age_ms
    data["attempts"] = [{"attempts": a, "jobs": n} for a, n in sorted(stats.attempts.items())]
    data["leases"] = [{"owner": x.owner, "held": x.count, "first_expiry_ms": x.first_expiry_ms} for x in stats.leases]
    data["expired_leases"] = stats.expired_leases
    data["inbox"] = store.inbox_totals(args.inbox, args.timeout) if args.inbox else None
    return report(data, out.render_status)


def _listing(path: str, now_ms: int, found: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    shown = found[:limit]
    return {
        "path": path,
        "now_ms": now_ms,
        "jobs": shown,
        "count": len(shown),
        "limit": limit,
        "more": len(found) > limit,
    }


def jobs(args: argparse.Namespace) -> Report:
    """Jobs filtered by status, queue and reason, oldest first (or ``--newest``), a page at a time."""
    filters = {"status": args.status, "queue": args.queue, "reason": args.reason}
    filters |= {"after": args.after, "limit": args.limit + 1}
    with store.reading(args.db, args.timeout) as (con, file):
        now = wall_clock_ms()
        found = store.list_jobs(con, filters, newest=args.newest, body=args.body)
    return report(_listing(file.path, now, found, args.limit), out.render_jobs)


def show(args: argparse.Namespace) -> Report:
    """One job's row, body included, and its audit history."""
    with store.reading(args.db, args.timeout) as (con, file):
        now = wall_clock_ms()
        found = store.read_job(con, args.id)
    if found is None:
        raise CliError(f"no job {args.id!r} in {file.path}")
    job, history = found
    return report({"path": file.path, "now_ms": now, "job": job, "history": history}, out.render_show)


def dead(args: argparse.Namespace) -> Report:
    """Dead jobs with their reasons, and the count for each reason."""
    filters = {"status": "dead", "queue": args.queue, "reason": args.reason, "after": args.after}
    filters["limit"] = args.limit + 1
    with store.reading(args.db, args.timeout) as (con, file), store.snapshot(con):
        now = wall_clock_ms()
        by_reason = store.dead_by_reason(con)
        found = store.list_jobs(con, filters, newest=False, body=False)
    data = _listing(file.path, now, found, args.limit) | {"by_reason": by_reason}
    return report(data, out.render_dead)


# -- operator changes -----------------------------------------------------------------------------------


def redrive(args: argparse.Namespace) -> Report:
    """Redrive the named dead jobs now, or preview (``--apply`` to write) all dead jobs with a reason."""
    if bool(args.ids) == (args.reason is not None):
        raise UsageError("name the dead jobs to redrive, or give --reason (not both)")
    if args.ids and (args.queue is not None or args.limit != -1):
        raise UsageError("--queue and --limit go with --reason")
    with store.reading(args.db, args.timeout) as (con, file), store.snapshot(con):
        if args.ids:
            targets = store.dead_jobs_named(con, list(dict.fromkeys(args.ids)))
        else:
            targets = store.redrivable(con, args.reason, args.queue, args.limit)
        before = store.last_audit_seq(con)
    applied = bool(args.ids) or args.apply
    data: dict[str, Any] = {"path": file.path, "applied": applied, "note": args.note, "jobs": targets}
    data |= {"count": len(targets), "audit": [], "skipped": []}
    if applied and targets:
        data["skipped"] = asyncio.run(_redrive_all(file, targets, args.note, args.ttl, args.timeout))
        data["audit"] = _audit_written(file.path, before, "redrive", {job["id"] for job in targets}, args.timeout)
    return report(data, out.render_redrive, 1 if data["skipped"] else 0)


async def _redrive_all(
    file: QueueFile, targets: list[dict[str, Any]], note: str, ttl_ms: int, timeout: float
) -> list[dict[str, str]]:
    skipped = []
    async with await _open(file, timeout) as queue:
        for job in targets:
            try:
                await queue.redrive(job["id"], note, ttl_ms=ttl_ms)
            except ValueError as error:  # it changed since it was read (another operator, a worker)
                skipped.append({"id": job["id"], "error": str(error)})
    return skipped


def _audit_written(path: str, after: int, action: str, ids: set[str], timeout: float) -> list[dict[str, Any]]:
    with store.reading(path, timeout) as (con, _file):
        rows = store.audit_since(con, after)
    return [row for row in rows if row["action"] == action and row["id"] in ids]


def cancel(args: argparse.Namespace) -> Report:
    """Park one pending job as dead (reason ``cancelled``), with an audit row."""
    file = store.probe_for_writing(args.db, args.timeout)
    with store.reading(file.path, args.timeout) as (con, _file):
        before = store.last_audit_seq(con)
    asyncio.run(_cancel(file, args.id, args.note, args.timeout))
    audit = _audit_written(file.path, before, "cancel", {args.id}, args.timeout)
    return report({"path": file.path, "id": args.id, "cancelled": True, "audit": audit[-1]}, out.render_cancel)


async def _cancel(file: QueueFile, job_id: str, note: str, timeout: float) -> None:
    async with await _open(file, timeout) as queue:
        await queue.cancel(job_id, note)


def prune(args: argparse.Namespace) -> Report:
    """Preview (``--apply`` to delete) the done and dead jobs that ended longer ago than ``--older-than``."""
    if args.vacuum and not args.apply:
        raise UsageError("--vacuum goes with --apply")
    statuses = tuple(args.status or ("done", "dead"))
    now = wall_clock_ms()
    cutoff = now - args.older_than
    with store.reading(args.db, args.timeout) as (con, file):
        by_status, ids = store.prunable(con, store.prune_params(cutoff, statuses, args.limit))
    data: dict[str, Any] = {"path": file.path, "applied": args.apply, "now_ms": now, "cutoff_ms": cutoff}
    data |= {"older_than_ms": args.older_than, "statuses": list(statuses), "by_status": by_status, "ids": ids}
    data |= {"count": sum(by_status.values()), "deleted": None, "vacuum": None, "free_pages": None}
    data |= {"bytes_before": None, "bytes_after": None}
    if args.apply:
        data |= store.prune(file, store.prune_params(cutoff, statuses), vacuum=args.vacuum, timeout=args.timeout)
    return report(data, out.render_prune)


def backup(args: argparse.Namespace) -> Report:
    """SQLite's online backup of the queue to PATH, checked, then renamed into place."""
    with store.reading(args.db, args.timeout) as (_con, file):
        pass
    data = {"source": file.path} | store.backup(file, args.path, force=args.force, timeout=args.timeout)
    return report(data, out.render_backup)
