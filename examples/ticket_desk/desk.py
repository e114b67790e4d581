"""The studio's desk tools: ``python3 desk.py reset | status | retry ID | repair ID [--apply]``.

* ``reset`` lays out the seed's starting point (the ack-first ``handler.py``, a fresh store with Mina
  Patel's ticket, an empty queue) and says so; see ``reset.py``.
* ``status`` reads the real rows (registrations, their tickets, completion keys) and the queue's counts,
  each with where it came from.
* ``retry ID`` republishes an existing registration so that the worker sees it again (a learner's
  explicit recovery, confirmed by the broker).
* ``repair ID`` previews a local repair of one registration and changes nothing; ``--apply`` applies
  exactly that plan in one transaction. It never consumes or acknowledges a queue message.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from asyncq.errors import AsyncqError

import broker
import repair
import reset
import store
from settings import Settings

REFUSED = 1
FAILED = 1


def status(settings: Settings) -> int:
    """Print the rows and the queue counts."""
    db = store.connect_read(settings.db_path)
    try:
        items = store.registrations(db)
        keys = store.completion_keys(db)
    finally:
        db.close()
    ready, unacknowledged = asyncio.run(broker.queue_counts(settings))
    print(f"Store: {settings.db_path}")
    print(f"{'ID':<8} {'Name':<24} {'Tickets':<16} Completed")
    for item in items:
        tickets = ", ".join(f"#{n}" for n in item.ticket_numbers) or "none"
        print(f"{item.id:<8} {item.name:<24} {tickets:<16} {'yes' if item.completed else 'no'}")
    print(f"Completion keys: {keys}")
    print(f"Queue {settings.queue}:")
    print(f"  ready: {ready}")
    print(f"  unacknowledged: {unacknowledged}")
    return 0


def retry(settings: Settings, registration_id: str) -> int:
    """Publish the registration's message again (confirmed and routed)."""
    db = store.connect_read(settings.db_path)
    try:
        item = store.registration(db, registration_id)
    finally:
        db.close()
    if item is None:
        print(f"Refusing: there is no registration {registration_id}.", file=sys.stderr)
        return REFUSED

    async def publish() -> None:
        async with broker.transport(settings) as transport:
            await transport.deliver(item.id, {"id": item.id, "name": item.name}, {"retry": "desk"})

    try:
        asyncio.run(publish())
    except AsyncqError as exc:  # not confirmed, or not routed to a queue: not republished
        print(f"Could not republish {item.id}: {exc}", file=sys.stderr)
        return FAILED
    print(f"Republished {item.id} ({item.name}) for redelivery.")
    return 0


def repair_one(settings: Settings, registration_id: str, apply: bool) -> int:
    """Preview, or apply, the repair of one registration."""
    db = store.connect(settings.db_path) if apply else store.connect_read(settings.db_path)
    try:
        plan = repair.apply(db, registration_id) if apply else repair.plan(db, registration_id)
    except repair.Refused as refusal:
        print(f"Refusing: {refusal}.", file=sys.stderr)
        return REFUSED
    finally:
        db.close()
    print("\n".join(plan.describe()))
    if not plan.changes_anything:
        print("Nothing to repair.")
    elif apply:
        print("Applied in one transaction.")
    else:
        print("Nothing changed. Run with --apply to apply this plan.")
    return 0


def reset_all(settings: Settings) -> int:
    """Lay out the seed's starting point."""
    try:
        lines = reset.reset(settings)
    except reset.Refused as refusal:
        print(f"Refusing: {refusal}.", file=sys.stderr)
        return REFUSED
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description="Nightjar's desk tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("reset", help="the seed's starting point: ack-first handler.py, fresh store, empty queue")
    commands.add_parser("status", help="registrations, tickets, completion keys and queue counts")
    commands.add_parser("retry", help="republish a registration for redelivery").add_argument("id")
    fix = commands.add_parser("repair", help="preview (or --apply) the repair of one registration")
    fix.add_argument("id")
    fix.add_argument("--apply", action="store_true", help="apply the plan in one transaction")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    broker.quiet_connect_errors()
    if args.command == "reset":
        return reset_all(settings)
    if args.command == "status":
        return status(settings)
    if args.command == "retry":
        return retry(settings, args.id)
    return repair_one(settings, args.id, args.apply)


if __name__ == "__main__":
    sys.exit(main())
