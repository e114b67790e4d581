"""``asyncq jobs --waiting`` (the jobs waiting for dependencies, and what each waits for) and ``asyncq groups`` (the
groups and their progress, or one group with its members): reads through the ``Queue`` facade."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from asyncq.cli import output as out
from asyncq.cli.commands import Report, reading, report
from asyncq.cli.errors import CliError
from asyncq.cli.records import job_record
from asyncq.core.dependencies import WaitsFor
from asyncq.core.groups import Group


def waits_record(waits: WaitsFor | None) -> dict[str, Any]:
    """What a job waits for: its dependencies (``id``, ``status``, ``on_dead``, ``state`` each) and its group."""
    if waits is None:
        return {"dependencies": [], "group": None}
    return {"dependencies": [asdict(each) for each in waits.dependencies], "group": waits.group}


def group_record(group: Group) -> dict[str, Any]:
    """A group's row and its progress (``running``: members not ended yet)."""
    return asdict(group) | {"running": group.running, "sealed": group.sealed, "complete": group.complete}


async def waiting(args: argparse.Namespace) -> Report:
    """The waiting jobs, oldest first, each with what it waits for."""
    async with await reading(args) as queue:
        found = await queue.list_jobs(
            status="waiting", queue=args.queue, after=args.after, limit=args.limit + 1, body=args.body
        )
        shown = found[: args.limit]
        waits = await queue.waiting_for([job.id for job in shown])
        now = queue.now()
    records = [job_record(job, body=args.body) | {"waits_for": waits_record(waits.get(job.id))} for job in shown]
    data = {"path": args.db, "now_ms": now, "jobs": records, "count": len(records), "limit": args.limit}
    return report(data | {"more": len(found) > args.limit}, render_waiting)


def render_waiting(data: dict[str, Any]) -> str:
    if not data["jobs"]:
        return "no job waits for another"
    rows = [(job["seq"], job["id"], job["queue"], job["priority"], job["waits"], unmet_text(job["waits_for"]),
             out.moment(job["deadline"], data["now_ms"])) for job in data["jobs"]]  # fmt: skip
    headers = ["seq", "id", "queue", "prio", "unmet", "waits for", "deadline"]
    more = "; there are more (--limit, or --after)" if data["more"] else ""
    return out.table(headers, rows) + f"\n{data['count']} waiting job(s){more}"


def unmet_text(waits: dict[str, Any]) -> str:
    """``a (leased), b (dead, wait)``: the dependencies not met yet, and ``group G`` for a callback."""
    parts = [
        f"{each['id']} ({each['status'] or 'removed'}{'' if each['on_dead'] == 'dead' else ', ' + each['on_dead']})"
        for each in waits["dependencies"]
        if each["state"] != "met"
    ]
    if waits["group"] is not None:
        parts.append(f"group {waits['group']}")
    return ", ".join(parts) or "-"


async def groups(args: argparse.Namespace) -> Report:
    """The groups by name with their progress, or one group (``NAME``) with its members."""
    async with await reading(args) as queue:
        if args.name is not None:
            group = await queue.group(args.name)
            if group is None:
                raise CliError(f"no group {args.name!r} in {args.db}")
            members = await queue.group_members(args.name, after=args.after_seq, limit=args.limit)
            data = {"path": args.db, "now_ms": queue.now(), "group": group_record(group)}
            return report(data | {"members": [job_record(job) for job in members]}, render_group)
        found = await queue.groups(open_only=args.open, after=args.after or "", limit=args.limit)
        data = {"path": args.db, "now_ms": queue.now(), "groups": [group_record(group) for group in found]}
    return report(data, render_groups)


def _state(group: dict[str, Any]) -> str:
    return "complete" if group["complete"] else "sealed" if group["sealed"] else "open"


def render_groups(data: dict[str, Any]) -> str:
    if not data["groups"]:
        return "no groups"
    now = data["now_ms"]
    rows = [(g["name"], _state(g), g["members"], g["done"], g["dead"], g["running"], out.moment(g["created_at"], now),
             g["callback_id"], g["callback_status"]) for g in data["groups"]]  # fmt: skip
    headers = ["group", "state", "members", "done", "dead", "running", "created", "callback", "status"]
    return out.table(headers, rows) + f"\n{len(rows)} group(s)"


def render_group(data: dict[str, Any]) -> str:
    group, now = data["group"], data["now_ms"]
    lines = [
        f"group     {group['name']} ({_state(group)})",
        f"members   {group['members']}: {group['done']} done, {group['dead']} dead, {group['running']} running",
        f"created   {out.moment(group['created_at'], now)}",
        f"sealed    {out.moment(group['sealed_at'], now)}",
        f"completed {out.moment(group['completed_at'], now)}",
        f"callback  {group['callback_id'] or '-'} ({group['callback_status'] or '-'})",
        "",
    ]
    rows = [(job["seq"], job["id"], job["status"], job["reason"], f"{job['attempts']}/{job['max_attempts']}")
            for job in data["members"]]  # fmt: skip
    return "\n".join(lines) + (out.table(["seq", "id", "status", "reason", "attempts"], rows) if rows else "no members")
