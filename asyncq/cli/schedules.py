"""``asyncq schedules``: the stored schedules (when each ticks, its last tick and next run, paused or retired, its
counters) and their recent skipped and missed ticks (``--events``: every event, moves too), read-only; ``pause``,
``resume`` and ``run-now`` NAME with ``--note`` change one, each with an event naming who and why."""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from dataclasses import asdict
from typing import Any

from asyncq.cli.commands import Report, reading, report, writing
from asyncq.cli.errors import CliError, UsageError
from asyncq.cli.output import iso, moment, table
from asyncq.core.clock import wall_clock_ms
from asyncq.core.schedules import Schedule, timing_text

#: The skipped and missed ticks the listing shows under the table.
RECENT_SKIPPED = 10


async def schedules(args: argparse.Namespace) -> Report:
    """List the schedules (``list``), or pause, resume or run one now."""
    if args.action == "list":
        if args.note is not None or args.by is not None:
            raise UsageError("--note and --by go with pause, resume or run-now")
        return await _listing(args)
    if args.name is None or args.note is None:
        raise UsageError(f"schedules {args.action} needs a NAME and --note")
    if args.events:
        raise UsageError("--events goes with list")
    by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    async with await writing(args) as queue:
        if args.action == "run-now":
            event = await queue.run_schedule_now(args.name, note=args.note, by=by)
        elif args.action == "pause":
            event = await queue.pause_schedule(args.name, note=args.note, by=by)
        else:
            event = await queue.resume_schedule(args.name, note=args.note, by=by)
    return report({"path": args.db, "event": asdict(event)}, render_move)


async def _listing(args: argparse.Namespace) -> Report:
    now = wall_clock_ms()
    async with await reading(args, now) as queue:
        found = [each for each in await queue.schedules() if args.name is None or each.name == args.name]
        events = await queue.schedule_events(
            args.name, limit=args.limit if args.events else RECENT_SKIPPED, skipped_only=not args.events
        )
    if args.name is not None and not found:
        raise CliError(f"no schedule named {args.name!r}")
    data: dict[str, Any] = {"path": args.db, "now_ms": now, "schedules": [_record(each) for each in found]}
    data["events" if args.events else "skipped"] = [asdict(event) for event in events]
    return report(data, render_schedules)


def _record(schedule: Schedule) -> dict[str, Any]:
    body = json.loads(schedule.definition.body)
    return schedule.record() | {"body": body, "when": timing_text(schedule.definition)}


def _state(record: dict[str, Any]) -> str:
    if record["retired_at"] is not None:
        return "retired"
    return "paused" if record["paused_at"] is not None else "running"


def render_schedules(data: dict[str, Any]) -> str:
    """The schedules as a table, then the recent skipped ticks (or every event, with ``--events``)."""
    now = data["now_ms"]
    rows = [
        (s["name"], s["when"], _state(s), s["task"], s["queue"], f"{s['overlap']}/{s['missed']}",
         moment(s["last_tick"], now), moment(s["next_tick"], now), s["ticks_fired"], s["ticks_skipped"],
         s["ticks_missed"])
        for s in data["schedules"]
    ]  # fmt: skip
    headers = ["name", "when", "state", "task", "queue", "overlap/missed", "last tick", "next run", "fired",
               "skipped", "missed"]  # fmt: skip
    lines = [table(headers, rows) if rows else "no schedules"]
    for s in data["schedules"]:
        if s["paused_at"] is not None:
            lines.append(f"{s['name']}: paused {moment(s['paused_at'], now)} by {s['paused_by']}: {s['pause_note']}")
        if s["queued_tick"] is not None:
            lines.append(f"{s['name']}: tick {iso(s['queued_tick'])} held until its previous run ends (queue_one)")
    if "events" in data:
        lines += ["", "events, newest first:", _events(data["events"], now)]
    else:
        lines += ["", "recent skipped and missed ticks, newest first:", _events(data["skipped"], now)]
    return "\n".join(lines)


def _events(events: list[dict[str, Any]], now: int) -> str:
    if not events:
        return "none"
    rows = [
        (e["seq"], e["schedule"], e["kind"], _tick(e), moment(e["at_ms"], now), e["job_id"], e["actor"], e["note"])
        for e in events
    ]
    return table(["seq", "schedule", "kind", "tick", "at", "job", "by", "note"], rows)


def _tick(event: dict[str, Any]) -> str | None:
    if event["tick_ms"] is None:
        return None
    if event["through_ms"] is None:
        return iso(event["tick_ms"])
    return f"{iso(event['tick_ms'])} … {iso(event['through_ms'])} ({event['ticks']} ticks)"


def render_move(data: dict[str, Any]) -> str:
    event = data["event"]
    job = f": job {event['job_id']}" if event["job_id"] else ""
    return f"schedule {event['schedule']}: {event['kind']} by {event['actor']} ({event['note']}){job}"
