"""The bodies of the ``asyncq`` subcommands that set up and read a queue (the operator's changes are in
``asyncq.cli.operator``, the long-running ones in ``asyncq.cli.work``). Each takes the parsed arguments and
returns a ``Report``: the data ``--json`` prints and the text a person reads.

Everything goes through the ``Queue`` facade, so the rules live in one place. Reads open the queue read-only
(``Queue.open(read_only=True)``), with one ``now`` for the whole command; writes open only a queue that exists
(``Queue.open_existing``, which keeps the file's journal mode); only ``init`` creates one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from asyncq.cli import output as out
from asyncq.cli.arguments import MISSING
from asyncq.cli.errors import CliError, UsageError
from asyncq.cli.records import audit_record, error_record, job_record, limit_record, retention_rule_record
from asyncq.core.clock import wall_clock_ms
from asyncq.core.jobs import JobSpec
from asyncq.core.jsontext import loads_strict
from asyncq.errors import Conflict
from asyncq.queue import Queue

ENQUEUE_BATCH = 500
LINE_KEYS = frozenset(
    {"id", "body", "queue", "max_attempts", "ttl_ms", "delay_ms", "priority", "unique_key", "limit_key"}
)


@dataclass(frozen=True)
class Report:
    """What a command found or did: ``data`` for ``--json``, ``text`` for a person, and the exit status."""

    data: dict[str, Any]
    text: str
    code: int = 0


def report(data: dict[str, Any], render: Callable[[dict[str, Any]], str], code: int = 0) -> Report:
    """A ``Report`` whose text is ``render(data)``."""
    return Report(data, render(data), code)


async def reading(args: argparse.Namespace, now_ms: int | None = None) -> Queue:
    """The queue ``--db`` names, read-only, its clock stopped at ``now_ms`` (default: now)."""
    now = wall_clock_ms() if now_ms is None else now_ms
    return await Queue.open(args.db, read_only=True, busy_timeout=args.timeout, clock=lambda: now)


async def writing(args: argparse.Namespace, now_ms: int | None = None) -> Queue:
    """The existing queue ``--db`` names, for writing (never created), its clock stopped at ``now_ms`` if given."""
    if now_ms is None:
        return await Queue.open_existing(args.db, busy_timeout=args.timeout)
    return await Queue.open_existing(args.db, busy_timeout=args.timeout, clock=lambda: now_ms)


# -- init -----------------------------------------------------------------------------------------------

INIT_ACTIONS = {"missing": "created", "empty": "created", "other": "added"}
#: What ``init`` reports of each kind of store, from its ``describe()``.
INIT_KEYS = {
    "sqlite": ("schema_version", "journal_mode", "auto_vacuum"),
    "postgresql": ("store", "schema_version", "schema"),
}


async def init(args: argparse.Namespace) -> Report:
    """Create a queue file (new files get ``auto_vacuum=INCREMENTAL``), add the queue tables to an app's SQLite
    file, or migrate an older queue; the report says which (or that it was current already)."""
    state = await Queue.inspect(args.db, busy_timeout=args.timeout)
    network = state.settings.get("network_filesystem")
    if network:
        raise CliError(
            f"{args.db} is on a {network} file system, where SQLite's locks are unreliable: use a local disk"
        )
    if state.kind == "queue" and state.schema_version > state.current_version:
        raise CliError(str(state.problem))
    directory = os.path.dirname(os.path.abspath(args.db))
    if state.store == "sqlite" and state.kind == "missing" and not os.path.isdir(directory):
        raise CliError(f"no such directory: {directory} (create it first)")
    action = INIT_ACTIONS.get(state.kind, "migrated" if state.schema_version < state.current_version else "checked")
    durability = args.durability or ("full" if state.kind in ("missing", "empty") else None)
    async with await Queue.open(args.db, durability=durability, busy_timeout=args.timeout) as queue:
        found = await queue.describe()
    data = {"path": args.db, "action": action, "created": action == "created"}
    data |= {"previous_schema_version": state.schema_version if state.kind == "queue" else None}
    described: dict[str, Any] = dict(found)
    data |= {key: described[key] for key in INIT_KEYS[found["store"]]}
    return report(data, out.render_init)


# -- enqueue --------------------------------------------------------------------------------------------


async def enqueue(args: argparse.Namespace) -> Report:
    """One job from the arguments, or one per JSON line on stdin, in transactions of 500."""
    if args.delay > args.ttl:
        raise UsageError("--delay must not be longer than --ttl (the job would expire before its first attempt)")
    defaults = {"queue": args.queue, "max_attempts": args.max_attempts, "ttl_ms": args.ttl, "delay_ms": args.delay}
    defaults["priority"] = args.priority
    defaults["unique_key"] = args.unique_key
    defaults["limit_key"] = args.limit_key
    if args.id is not None:
        if args.body is MISSING:
            raise UsageError("give the job's BODY (JSON) after its ID")
        specs = [checked_spec(defaults | {"id": args.id, "body": args.body}, "BODY", UsageError)]
    elif args.body is not MISSING or sys.stdin.isatty():
        raise UsageError("give ID BODY, or pipe JSON lines on stdin")
    else:
        specs = read_specs(sys.stdin, defaults)
    progress = None
    if len(specs) > 1 and sys.stderr.isatty():
        progress = out.ProgressBar(len(specs), sys.stderr)
    async with await writing(args) as queue:
        added, held_by = await _enqueue_all(queue, specs, progress)
    unchanged = len(specs) - added - len(held_by)
    data = {"path": args.db, "added": added, "unchanged": unchanged, "total": len(specs), "held_by": held_by}
    return report(data, out.render_enqueue)


def checked_spec(fields: dict[str, Any], where: str, error: type[CliError] = CliError) -> JobSpec:
    """A job spec whose every field has been checked as ``enqueue`` will check it. The command's durations are
    milliseconds (``--ttl 2d`` parses to them, and so do the ``ttl_ms``/``delay_ms`` keys of a stdin line)."""
    fields = dict(fields)
    for key in ("ttl_ms", "delay_ms"):
        value = fields.pop(key, None)
        if value is not None:
            if type(value) is not int:
                raise error(f"{where}: {key} must be an int of milliseconds, not {type(value).__name__}")
            fields[key.removesuffix("_ms")] = value / 1000
    spec = JobSpec(**fields)
    try:
        spec.to_row(wall_clock_ms())
    except (ValueError, TypeError) as problem:
        raise error(f"{where}: {problem}") from None
    return spec


def read_specs(lines: Iterable[str], defaults: dict[str, Any]) -> list[JobSpec]:
    """Every line checked before anything is written: ``{"id", "body"}`` and optionally ``queue``,
    ``max_attempts``, ``ttl_ms``, ``delay_ms``, ``priority``, ``unique_key``, ``limit_key`` (the options give the
    defaults); blank
    lines skipped.
    Lines are strict JSON (no NaN, no repeated keys), as everywhere in asyncq."""
    specs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"stdin line {number}"
        try:
            item = loads_strict(line.encode("utf-8", "surrogateescape"))
        except ValueError as error:
            raise CliError(f"{where} is not JSON: {error}") from None
        if type(item) is not dict or not {"id", "body"} <= item.keys() or not item.keys() <= LINE_KEYS:
            raise CliError(f"{where} must be an object with id and body, and only {sorted(LINE_KEYS)}")
        specs.append(checked_spec(defaults | item, where))
    return specs


async def _enqueue_all(queue: Queue, specs: list[JobSpec], bar: out.ProgressBar | None) -> tuple[int, dict[str, str]]:
    """How many jobs were added, and for each not added because an active job holds its unique key, that job."""
    added = 0
    held_by: dict[str, str] = {}
    for start in range(0, len(specs), ENQUEUE_BATCH):
        batch = specs[start : start + ENQUEUE_BATCH]
        try:
            results = await queue.enqueue_many(batch)
        except Conflict as error:
            if len(specs) == 1:
                raise
            raise CliError(
                f"{error}: jobs {start + 1}-{start + len(batch)} were not written, the {start} before them were "
                "(enqueueing the same id and body again changes nothing, so fix the input and run it again)"
            ) from None
        added += sum(result is True for result in results)
        held_by |= {spec.id: result for spec, result in zip(batch, results, strict=True) if isinstance(result, str)}
        if bar is not None:
            bar.show(start + len(batch))
    if bar is not None:
        bar.close()
    return added, held_by


# -- reads ----------------------------------------------------------------------------------------------


async def status(args: argparse.Namespace) -> Report:
    """Counts by status and dead reason, the oldest ready job's wait, attempts, leases by owner."""
    async with await reading(args) as queue:
        stats = await queue.stats()
        settings = await queue.queue_settings()
        rules = await queue.retention_rules()
        limits = await queue.limits()
    data: dict[str, Any] = {"path": args.db, "now_ms": stats.now_ms, "total": stats.total}
    data["queues"] = [asdict(each) | {"paused": each.paused} for each in settings]
    data["retention"] = [retention_rule_record(rule) for rule in rules]
    data["limits"] = [limit_record(usage) for usage in limits]
    data |= {"by_status": stats.by_status, "dead_by_reason": dict(sorted(stats.dead_by_reason.items()))}
    data["oldest_pending_age_ms"] = stats.oldest_ready_age_ms
    data["attempts"] = [{"attempts": a, "jobs": n} for a, n in sorted(stats.attempts.items())]
    data["leases"] = [{"owner": x.owner, "held": x.count, "first_expiry_ms": x.first_expiry_ms} for x in stats.leases]
    data["expired_leases"] = stats.expired_leases
    data["inbox"] = None
    if args.inbox:
        from asyncq.inbox.receiver import read_totals  # the receiver's reader; it loads aiohttp, so only here

        data["inbox"] = {"file": args.inbox} | await read_totals(args.inbox, args.timeout)
    return report(data, out.render_status)


def _listing(path: str, now_ms: int, records: list[dict[str, Any]], limit: int, more: bool) -> dict[str, Any]:
    return {"path": path, "now_ms": now_ms, "jobs": records, "count": len(records), "limit": limit, "more": more}


async def jobs(args: argparse.Namespace) -> Report:
    """Jobs filtered by status, queue and reason, oldest first (or ``--newest``), a page at a time; ``--waiting``:
    the jobs waiting for dependencies, with what each waits for (``asyncq.cli.graphs``)."""
    if args.waiting:
        if args.status is not None or args.reason is not None or args.newest:
            raise UsageError("--waiting lists waiting jobs: it takes no --status, --reason or --newest")
        from asyncq.cli.graphs import waiting  # beside this module's helpers, which it uses

        return await waiting(args)
    async with await reading(args) as queue:
        found = await queue.list_jobs(
            status=args.status, queue=args.queue, reason=args.reason, after=args.after, limit=args.limit + 1,
            newest=args.newest, body=args.body,
        )  # fmt: skip
        now = queue.now()
    records = [job_record(job, body=args.body) for job in found[: args.limit]]
    return report(_listing(args.db, now, records, args.limit, len(found) > args.limit), out.render_jobs)


async def show(args: argparse.Namespace) -> Report:
    """One job's row, body included, the error of each failed attempt, and its audit history."""
    async with await reading(args) as queue:
        job = await queue.get(args.id)
        history = await queue.history(args.id) if job is not None else []
        now = queue.now()
    if job is None:
        raise CliError(f"no job {args.id!r} in {args.db}")
    record = job_record(job, body=True) | {"errors": [error_record(error) for error in job.errors]}
    if job.result_json is not None:  # a task's stored result
        record["result"] = job.result
    data = {"path": args.db, "now_ms": now, "job": record, "history": [audit_record(entry) for entry in history]}
    return report(data, out.render_show)


async def dead(args: argparse.Namespace) -> Report:
    """Dead jobs with their reasons and last errors, and the count for each reason."""
    async with await reading(args) as queue:
        by_reason = dict(sorted((await queue.stats()).dead_by_reason.items()))
        found = await queue.list_jobs(
            status="dead", queue=args.queue, reason=args.reason, after=args.after, limit=args.limit + 1, body=False
        )
        records = [await _with_last_error(queue, job_record(job)) for job in found[: args.limit]]
        now = queue.now()
    data = _listing(args.db, now, records, args.limit, len(found) > args.limit) | {"by_reason": by_reason}
    return report(data, out.render_dead)


async def _with_last_error(queue: Queue, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its job's newest error (listings leave errors out: ``get`` reads them)."""
    job = await queue.get(record["id"])
    last = None if job is None or job.last_error is None else error_record(job.last_error)
    return record | {"last_error": last}
