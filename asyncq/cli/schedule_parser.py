"""The ``asyncq schedules`` command line (its body is ``asyncq.cli.schedules``), kept beside the parser so that the
parser's module stays a screen a command group."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncq.cli.parser import Adder, Run

ACTIONS = ("list", "pause", "resume", "run-now")


def add_schedules(
    add: Adder,
    command: Callable[[str, str], Run],
    note: Callable[[str], str],
    identifier: Callable[[str], str],
    whole: Callable[[int, int], Callable[[str], int]],
) -> None:
    """The ``schedules`` subcommand (``asyncq.cli.parser`` hands its helpers in)."""
    summary = "The stored schedules and their skipped ticks; pause, resume or run-now one (with --note, audited)."
    schedules = add("schedules", command("schedules", "schedules"), summary)
    schedules.add_argument("action", nargs="?", choices=ACTIONS, default="list", help="what to do (default: list)")
    schedules.add_argument("name", nargs="?", type=identifier, metavar="NAME", help="the schedule")
    schedules.add_argument("--events", action="store_true", help="list every event (moves too), newest first")
    schedules.add_argument("--limit", type=whole(1, 1000), default=50, help="events to list (default 50)")
    schedules.add_argument("--note", type=note, help="why (pause, resume, run-now: kept in the event)")
    schedules.add_argument("--by", type=note, help="who (default: USER@HOST)")
