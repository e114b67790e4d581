"""The operator's changes through the ``asyncq`` command: redrive (named jobs at once, or every dead job with a
reason after a preview), cancel, pause, resume, max-wait, retention, limits, prune (a preview, then ``--apply``) and the
online backup. Previews open the queue read-only; changes go through ``Queue``, which writes each audit row and
returns it to be printed."""

from __future__ import annotations

import argparse
import getpass
import socket
from typing import Any

from asyncq.cli import output as out
from asyncq.cli.arguments import MISSING
from asyncq.cli.commands import Report, reading, report, writing
from asyncq.cli.errors import CliError, UsageError
from asyncq.cli.records import audit_record, limit_record, queue_audit_record, retention_rule_record
from asyncq.core.clock import wall_clock_ms
from asyncq.core.flow import QueueAuditEntry
from asyncq.core.flow_limits import UNLIMITED, per_seconds
from asyncq.core.jobs import MAX_BATCH, Job
from asyncq.core.retention import FOREVER, RETENTION_STATES, rule_for
from asyncq.queue import Queue


def _target(job: Job) -> dict[str, Any]:
    return {"id": job.id, "queue": job.queue, "token": job.token, "reason": job.reason}


async def named_dead_jobs(queue: Queue, ids: list[str]) -> list[dict[str, Any]]:
    """The named jobs, which must all exist and be dead (``CliError`` naming the first that is not)."""
    targets = []
    for job_id in ids:
        job = await queue.get(job_id)
        if job is None or job.status != "dead":
            state = "missing" if job is None else f"{job.status}, not dead"
            raise CliError(f"job {job_id!r} is {state}: nothing redriven")
        targets.append(_target(job))
    return targets


async def dead_with_reason(
    queue: Queue, reason: str, queue_name: str | None, limit: int | None
) -> list[dict[str, Any]]:
    """Dead jobs with ``reason`` (in ``queue_name``), oldest first, at most ``limit`` (``None``: all), read a
    page at a time."""
    targets: list[dict[str, Any]] = []
    after = 0
    while limit is None or len(targets) < limit:
        page = min(MAX_BATCH, MAX_BATCH if limit is None else limit - len(targets))
        found = await queue.list_jobs(
            status="dead", reason=reason, queue=queue_name, after=after, limit=page, body=False
        )
        targets += [_target(job) for job in found]
        if len(found) < page:
            break
        after = found[-1].seq
    return targets


async def _redrive_all(
    queue: Queue, targets: list[dict[str, Any]], note: str, ttl_ms: int
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    audit, skipped = [], []
    for job in targets:
        try:
            audit.append(audit_record(await queue.redrive(job["id"], note, ttl=ttl_ms / 1000)))
        except ValueError as error:  # it changed since it was read (another operator, a worker)
            skipped.append({"id": job["id"], "error": str(error)})
    return audit, skipped


async def redrive(args: argparse.Namespace) -> Report:
    """Redrive the named dead jobs now, or preview (``--apply`` to write) all dead jobs with a reason."""
    if bool(args.ids) == (args.reason is not None):
        raise UsageError("name the dead jobs to redrive, or give --reason (not both)")
    if args.ids and (args.queue is not None or args.limit is not None or args.apply):
        raise UsageError("--queue, --limit and --apply go with --reason")
    applied = bool(args.ids) or args.apply
    audit: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    async with await (writing(args) if applied else reading(args)) as queue:
        if args.ids:
            targets = await named_dead_jobs(queue, list(dict.fromkeys(args.ids)))
        else:
            targets = await dead_with_reason(queue, args.reason, args.queue, args.limit)
        if applied:
            audit, skipped = await _redrive_all(queue, targets, args.note, args.ttl)
    data: dict[str, Any] = {"path": args.db, "applied": applied, "note": args.note, "jobs": targets}
    data |= {"count": len(targets), "audit": audit, "skipped": skipped}
    return report(data, out.render_redrive, 1 if skipped else 0)


async def cancel(args: argparse.Namespace) -> Report:
    """Cancel one job (``Queue.cancel``) and say what happened: ``cancelled``, ``requested`` or ``too_late`` (exit
    status 1: nothing was cancelled)."""
    async with await writing(args) as queue:
        outcome = await queue.cancel(args.id, args.note)
    audit = None if outcome.audit is None else audit_record(outcome.audit)
    data = {"path": args.db, "id": args.id, "state": str(outcome.state), "status": outcome.status, "audit": audit}
    return report(data, out.render_cancel, 1 if outcome.state == "too_late" else 0)


def _operator() -> str:
    """Who runs this command, for the audit: ``USER@HOST``."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


async def pause(args: argparse.Namespace) -> Report:
    """Pause a queue (stored: every worker on every host stops claiming from it; jobs in flight finish)."""
    async with await writing(args) as queue:
        entry = await queue.pause(args.queue, note=args.note, by=args.by or _operator())
    return report({"path": args.db, "queue": args.queue, "audit": queue_audit_record(entry)}, out.render_queue_move)


async def resume(args: argparse.Namespace) -> Report:
    """Resume a paused queue."""
    async with await writing(args) as queue:
        entry = await queue.resume(args.queue, note=args.note, by=args.by or _operator())
    return report({"path": args.db, "queue": args.queue, "audit": queue_audit_record(entry)}, out.render_queue_move)


async def max_wait(args: argparse.Namespace) -> Report:
    """Set (``none``: clear) a queue's ``max_wait``."""
    wait = None if args.wait is None else args.wait / 1000
    async with await writing(args) as queue:
        entry = await queue.set_max_wait(args.queue, wait, note=args.note, by=args.by or _operator())
    return report({"path": args.db, "queue": args.queue, "audit": queue_audit_record(entry)}, out.render_queue_move)


async def retention(args: argparse.Namespace) -> Report:
    """Set the retention rule of a queue, of a task's jobs in it (``--task``) or of every queue (``--default``): a flag
    not given keeps the value that applies now; ``--clear`` removes the rule; ``--run`` the removal now (run after
    run, each a few bounded transactions, until nothing expired is left). With none of these, list the rules."""
    given = {state: getattr(args, state) for state in RETENTION_STATES if getattr(args, state) is not MISSING}
    scoped = args.queue is not None or args.every_queue
    _check_retention_usage(args, given, scoped)
    data: dict[str, Any] = {"path": args.db, "queue": args.queue, "task": args.task, "default": args.every_queue}
    data |= {"audit": None, "run": None, "rules": None}
    if not scoped and not args.run_now:
        async with await reading(args) as queue:
            data["rules"] = [retention_rule_record(rule) for rule in await queue.retention_rules()]
        return report(data, out.render_retention)
    async with await writing(args) as queue:
        if scoped:
            data["audit"] = queue_audit_record(await _set_retention(queue, args, given))
        if args.run_now:
            data["run"] = await _run_retention(queue)
    return report(data, out.render_retention)


def _check_retention_usage(args: argparse.Namespace, given: dict[str, int | None], scoped: bool) -> None:
    if args.every_queue and args.queue is not None:
        raise UsageError("--default is the rule of every queue: name no QUEUE with it")
    if args.task is not None and args.queue is None:
        raise UsageError("--task names a task's rule in a QUEUE: name the QUEUE too")
    if args.clear and given:
        raise UsageError("--clear removes the rule: give no --done, --cancelled or --dead with it")
    if scoped and not given and not args.clear:
        raise UsageError("give at least one of --done, --cancelled, --dead (a duration such as 7d, or none) or --clear")
    if not scoped and (given or args.clear or args.note is not None or args.by is not None):
        raise UsageError("--done, --cancelled, --dead, --clear, --note and --by go with a QUEUE or --default")


async def _set_retention(queue: Queue, args: argparse.Namespace, given: dict[str, int | None]) -> QueueAuditEntry:
    by = args.by or _operator()
    if args.clear:
        if args.every_queue:
            return await queue.clear_default_retention(note=args.note, by=by)
        return await queue.clear_retention(args.queue, task=args.task, note=args.note, by=by)
    rules = await queue.retention_rules()
    if args.every_queue:
        current = next((rule.windows for rule in rules if rule.queue is None), FOREVER)
    else:
        current = rule_for(rules, args.queue, args.task) or FOREVER
    windows = {state: current.of(state) for state in RETENTION_STATES} | given
    seconds = {state: None if ms is None else ms / 1000 for state, ms in windows.items()}
    if args.every_queue:
        return await queue.set_default_retention(**seconds, note=args.note, by=by)
    return await queue.set_retention(args.queue, task=args.task, **seconds, note=args.note, by=by)


async def _run_retention(queue: Queue) -> dict[str, Any]:
    removed: dict[tuple[str, str, str], int] = {}
    batches = 0
    while True:
        done = await queue.apply_retention()
        batches += done.batches
        for item in done.removed:
            key = (item.queue, item.task or "", item.state)
            removed[key] = removed.get(key, 0) + item.jobs
        if done.complete:
            break
    rows = [
        {"queue": name, "task": task or None, "state": state, "jobs": jobs}
        for (name, task, state), jobs in sorted(removed.items())
    ]
    return {"removed": rows, "total": sum(removed.values()), "batches": batches}


_LIMIT_FLAGS = {"concurrency": "concurrency", "per_key": "per_key_concurrency", "rate": "rate"}
_RATE_FLAGS = ("per", "burst")


async def limits(args: argparse.Namespace) -> Report:
    """Set a queue's limits (a flag not given keeps the queue's value; ``none`` clears one), or show the limits in
    force (of QUEUE only, if named) and what they hold now."""
    given = {name: getattr(args, flag) for flag, name in _LIMIT_FLAGS.items() if getattr(args, flag) is not MISSING}
    given |= {name: getattr(args, name) for name in _RATE_FLAGS if getattr(args, name) is not MISSING}
    if "per" in given:
        given["per"] = given["per"] / 1000  # the command's durations are milliseconds
    if args.queue is None and (given or args.note is not None or args.by is not None):
        raise UsageError("--concurrency, --per-key, --rate, --per, --burst, --note and --by go with a QUEUE")
    data: dict[str, Any] = {"path": args.db, "queue": args.queue, "audit": None}
    if not given:
        async with await reading(args) as queue:
            found = [limit_record(usage) for usage in await queue.limits()]
            data |= {"now_ms": queue.now(), "limits": [r for r in found if args.queue in (None, r["queue"])]}
        return report(data, out.render_limits)
    async with await writing(args) as queue:
        current = next((each.limits for each in await queue.queue_settings() if each.queue == args.queue), UNLIMITED)
        wanted = {name: getattr(current, name) for name in ("concurrency", "per_key_concurrency", "rate", "burst")}
        wanted |= {"per": per_seconds(current)} | given
        if wanted["rate"] is None and "rate" in given:  # a rate cleared takes its shape with it
            wanted |= {"per": None, "burst": None}
        elif wanted["rate"] is None and given.keys() & set(_RATE_FLAGS):
            raise UsageError(f"queue {args.queue} has no rate: --per and --burst shape one (give --rate too)")
        entry = await queue.set_limits(args.queue, **wanted, note=args.note, by=args.by or _operator())
        data |= {"audit": queue_audit_record(entry), "now_ms": queue.now()}
        data["limits"] = [limit_record(usage) for usage in await queue.limits() if usage.queue == args.queue]
    return report(data, out.render_limits)


async def prune(args: argparse.Namespace) -> Report:
    """Preview (``--apply`` to delete) the done and dead jobs that ended longer ago than ``--older-than``; one
    ``now`` for the whole command, so the preview's figures are exactly what the delete meets."""
    if args.vacuum and not args.apply:
        raise UsageError("--vacuum goes with --apply")
    statuses = tuple(dict.fromkeys(args.status or ("done", "dead")))
    now = wall_clock_ms()
    data: dict[str, Any] = {"path": args.db, "applied": args.apply, "now_ms": now, "cutoff_ms": now - args.older_than}
    data |= {"older_than_ms": args.older_than, "statuses": list(statuses)}
    data |= dict.fromkeys(("deleted", "vacuum", "free_pages", "bytes_before", "bytes_after"))
    async with await (writing(args, now) if args.apply else reading(args, now)) as queue:
        by_status, ids = await queue.prunable(args.older_than / 1000, statuses, args.limit)
        if args.apply:
            data |= await queue.prune(args.older_than / 1000, statuses, vacuum=args.vacuum)
    data |= {"by_status": by_status, "ids": ids, "count": sum(by_status.values())}
    return report(data, out.render_prune)


async def backup(args: argparse.Namespace) -> Report:
    """SQLite's online backup of the queue to PATH (or into PATH, a directory), checked, then renamed into place."""
    async with await reading(args) as queue:
        done = await queue.backup(args.path, force=args.force)
    return report({"source": args.db} | done, out.render_backup)
