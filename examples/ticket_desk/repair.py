"""A local repair for one registration whose ticket was written more than once.

The plan keeps the earliest ticket (its number and content unchanged), removes the extra ticket numbers,
and records the registration's completion key so the fixed handler skips any later redelivery. It is
refused for an unknown id, an id with no ticket, and tickets whose name differs from the registration's.
Nothing else is touched: no other registration or ticket, and no queue message.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import store


class Refused(Exception):
    """The repair does not apply to this id; nothing was changed."""


@dataclass(frozen=True)
class Plan:
    """What ``repair ID --apply`` does for one registration."""

    registration_id: str
    name: str
    keep: int
    remove: tuple[int, ...]
    add_completion: bool

    @property
    def changes_anything(self) -> bool:
        """Whether applying the plan changes a row."""
        return bool(self.remove) or self.add_completion

    def describe(self) -> list[str]:
        """The plan in words, one line each."""
        removed = ", ".join(f"#{n}" for n in self.remove) or "none"
        record = f"add {self.registration_id}" if self.add_completion else "already recorded"
        return [
            f"Repair plan for {self.registration_id} ({self.name}):",
            f"  keep the earliest ticket: #{self.keep}",
            f"  remove extra tickets: {removed}",
            f"  completion record: {record}",
        ]


def plan(db: sqlite3.Connection, registration_id: str) -> Plan:
    """The repair plan for ``registration_id``, or ``Refused``; reads only."""
    item = store.registration(db, registration_id)
    if item is None:
        raise Refused(f"there is no registration {registration_id}")
    tickets = store.tickets_for(db, registration_id)
    if not tickets:
        raise Refused(f"{registration_id} has no ticket; the worker issues it, repair does not")
    other_names = sorted({t.name for t in tickets if t.name != item.name})
    if other_names:
        names = ", ".join(repr(name) for name in other_names)
        raise Refused(
            f"{registration_id} is registered for {item.name!r} but has a ticket for {names}; "
            "that needs a person, not a repair"
        )
    keep, *extra = (t.ticket_no for t in tickets)
    return Plan(registration_id, item.name, keep, tuple(extra), not item.completed)


def apply(db: sqlite3.Connection, registration_id: str) -> Plan:
    """Plan and apply in one transaction: the plan is made from the rows the transaction changes."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        chosen = plan(db, registration_id)
        for ticket_no in chosen.remove:
            db.execute("DELETE FROM tickets WHERE ticket_no = ? AND registration_id = ?", (ticket_no, registration_id))
        if chosen.add_completion:
            db.execute("INSERT INTO completed VALUES (?)", (registration_id,))
    return chosen
