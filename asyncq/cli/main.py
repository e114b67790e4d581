"""The ``asyncq`` command (and ``python -m asyncq``): the operator's tool for a queue file.

Exit status: 0 done, 1 failed (a one-line ``asyncq: error: …`` on stderr, never a traceback), 2 usage.
Read commands (``status``, ``jobs``, ``show``, ``dead``, the ``redrive --reason`` and ``prune`` previews)
open the file read-only and never create it; only ``init`` creates a queue file. ``--json`` prints the
data as one JSON document on stdout (its keys are listed in docs/operations.md).

This module parses and dispatches; the commands are in ``asyncq.cli.commands`` and ``asyncq.cli.work``,
the file access in ``asyncq.store.sqlite.admin`` and the human output in ``asyncq.cli.output``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any

from asyncq.cli import commands as cli_commands
from asyncq.cli.output import emit
from asyncq.core.lifecycle import DEAD_REASONS, REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT, STATUSES
from asyncq.core.values import check_identifier
from asyncq.errors import AsyncqError
from asyncq.store.sqlite.admin import CliError

_DURATION = re.compile(r"(\d{1,9})(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DEFAULT_TIMEOUT = 5.0


# -- argument types: a bad value is a usage error (exit 2) before anything is opened -----------------------


def identifier(text: str) -> str:
    """A job id, note, queue or owner name: 1-64 ASCII letters, digits, ``_`` or ``-``."""
    try:
        return check_identifier(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 1-64 ASCII letters, digits, '_' or '-'") from None


def duration(text: str) -> int:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or ``500ms``, in milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 500ms, 90s, 30m, 12h, 7d or 2w")
    return int(match[1]) * _UNIT_MS[match[2]]


def json_value(text: str) -> Any:
    """A job body given as JSON text."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None


def seconds(text: str) -> float:
    """A non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0-86400)")
    return value


def count(text: str) -> int:
    """A whole number from 1 to 1,000,000."""
    if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 1000000")
    return int(text)


# -- the parser -------------------------------------------------------------------------------------------


def _common(*, json_output: bool = True) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    from_env = os.environ.get("ASYNCQ_DB") or None
    common.add_argument(
        "--db", default=from_env, required=from_env is None, metavar="PATH", help="the queue file (or $ASYNCQ_DB)"
    )
    common.add_argument(
        "--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long to wait for a lock held by another process (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    if json_output:
        common.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return common


def _page(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", type=identifier, help="only jobs of this queue")
    parser.add_argument("--limit", type=count, default=50, help="show at most this many (default 50)")
    parser.add_argument("--after", type=int, default=0, metavar="SEQ", help="start after this seq (paging)")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one subparser per command, each with ``--help``."""
    parser = argparse.ArgumentParser(
        prog="asyncq", description="Operate an asyncq queue file: inspect it, redrive, prune, back up, work."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common()

    def add(name: str, run: Callable[[argparse.Namespace], Any], summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=summary, description=summary)
        sub.set_defaults(run=run)
        return sub

    _add_setup(add)
    _add_readers(add)
    _add_operator(add)
    _add_processes(commands)
    return parser


Adder = Callable[[str, Callable[[argparse.Namespace], Any], str], argparse.ArgumentParser]


def _command(name: str) -> Callable[[argparse.Namespace], Any]:
    """A command body; ``work``, ``serve-inbox`` and ``dashboard`` are imported when they run (aiohttp)."""
    if name not in ("work", "serve_inbox", "dashboard"):
        function: Callable[[argparse.Namespace], Any] = getattr(cli_commands, name)
        return function

    def run(args: argparse.Namespace) -> Any:
        from asyncq.cli import work as cli_work

        return getattr(cli_work, name)(args)

    return run


def _add_readers(add: Adder) -> None:
    status = add("status", _command("status"), "Counts by status and dead reason, waits, attempts, leases.")
    status.add_argument("--inbox", metavar="SINK_DB", help="also show this receiver's applied/duplicates/conflicts")
    jobs = add("jobs", _command("jobs"), "List jobs, oldest first, filtered by status, queue and reason.")
    jobs.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    jobs.add_argument("--reason", choices=(*DEAD_REASONS, "retry"), help="only jobs with this reason")
    _page(jobs)
    jobs.add_argument("--newest", action="store_true", help="the newest jobs instead (no --after)")
    jobs.add_argument("--body", action="store_true", help="include each job's body")
    show = add("show", _command("show"), "One job's row and its audit history (redrives, cancel).")
    show.add_argument("id", type=identifier, metavar="ID")
    dead = add("dead", _command("dead"), "Dead jobs with their reasons.")
    dead.add_argument("--reason", choices=DEAD_REASONS, help="only dead jobs with this reason")
    _page(dead)
    dead.set_defaults(newest=False)


def _add_setup(add: Adder) -> None:
    init = add("init", _command("init"), "Create a queue file, or add asyncq's tables to a SQLite file.")
    init.add_argument("--durability", choices=("full", "full-delete", "normal"), help="journal mode of a new file")
    enqueue = add("enqueue", _command("enqueue"), "Enqueue one job (ID BODY) or many (JSON lines on stdin).")
    enqueue.add_argument("id", type=identifier, nargs="?", metavar="ID", help="the job's id (its idempotency key)")
    enqueue.add_argument("body", type=json_value, nargs="?", metavar="BODY", help="the job's body, as JSON")
    enqueue.add_argument("--queue", type=identifier, default="default", help="queue name (default: default)")
    enqueue.add_argument("--max-attempts", type=count, default=3, help="attempt budget (default 3)")
    enqueue.add_argument("--ttl", type=duration, default=86_400_000, help="time to live (default 1d)")
    enqueue.add_argument("--delay", type=duration, default=0, help="wait this long before the first attempt")


def _add_operator(add: Adder) -> None:
    redrive = add("redrive", _command("redrive"), "Give dead jobs a fresh budget, with an audit row each.")
    redrive.add_argument("ids", type=identifier, nargs="*", metavar="ID", help="dead jobs to redrive now")
    redrive.add_argument("--note", type=identifier, required=True, help="why (kept in the audit row)")
    reasons = (REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT)
    redrive.add_argument("--reason", choices=reasons, help="every dead job with this reason (a preview)")
    redrive.add_argument("--queue", type=identifier, help="with --reason: only this queue")
    redrive.add_argument("--limit", type=count, default=-1, help="with --reason: at most this many, oldest first")
    redrive.add_argument("--apply", action="store_true", help="with --reason: write, after the preview")
    redrive.add_argument("--ttl", type=duration, default=86_400_000, help="the fresh deadline (default 1d)")
    cancel = add("cancel", _command("cancel"), "Park a pending job as dead (reason cancelled), audited.")
    cancel.add_argument("id", type=identifier, metavar="ID")
    cancel.add_argument("--note", type=identifier, required=True, help="why (kept in the audit row)")
    prune = add("prune", _command("prune"), "Delete done and dead jobs past a retention age (a preview).")
    prune.add_argument("--older-than", type=duration, required=True, help="retention age, such as 7d")
    prune.add_argument("--status", choices=("done", "dead"), action="append", help="only done or only dead")
    prune.add_argument("--limit", type=count, default=20, help="ids to list in the preview (default 20)")
    prune.add_argument("--apply", action="store_true", help="delete them (their audit rows are kept)")
    prune.add_argument("--vacuum", action="store_true", help="with --apply: VACUUM a non-incremental file")
    backup = add("backup", _command("backup"), "Copy the queue with SQLite's online backup (safe while working).")
    backup.add_argument("path", metavar="PATH", help="the backup file to write")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")


def _add_processes(commands: Any) -> None:
    summary = "Run a worker pool: POST each job to --url, or call --handler module:function."
    work = commands.add_parser("work", parents=[_common()], help=summary, description=summary)
    work.set_defaults(run=_command("work"))
    target = work.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="deliver by HTTP POST here (a verified ACK: 200 and the job's id)")
    target.add_argument("--handler", metavar="MODULE:FUNCTION", help="an async function (body, context)")
    work.add_argument("--queue", type=identifier, action="append", help="queue to work (repeatable; default: default)")
    work.add_argument("--concurrency", type=count, default=16, help="jobs at once (default 16)")
    work.add_argument("--burst", action="store_true", help="exit once nothing is ready and nothing runs")
    work.add_argument("--grace", type=seconds, default=30.0, help="seconds for jobs in flight after a signal")
    work.add_argument("--lease", type=duration, default=30_000, help="lease length (default 30s)")
    work.add_argument("--owner", type=identifier, help="this worker's name in leases (default: random)")
    work.add_argument("--allow-host", action="append", help="with --url: a host or network allowed besides loopback")
    work.add_argument("--delivery-timeout", type=seconds, default=10.0, help="seconds per HTTP exchange")
    levels = ("debug", "info", "warning", "error")
    work.add_argument("--log-level", choices=levels, default="warning", help="log to stderr from (default warning)")
    summary = "Run the inbox receiver on a sink file (python -m asyncq.inbox)."
    inbox = commands.add_parser("serve-inbox", help=summary, description=summary)
    inbox.set_defaults(run=_command("serve_inbox"))
    inbox.add_argument("--db", required=True, metavar="PATH", help="the sink file (created if missing)")
    inbox.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    inbox.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    inbox.add_argument("--path", default="/events", help="the receiver's path (default /events)")
    inbox.add_argument("--effect", choices=("none", "stock"), default="none", help="'stock' adds qty to stock")
    summary = "Serve the status page (loopback by default; its redrive button needs the token it prints)."
    board = commands.add_parser("dashboard", help=summary, description=summary)
    board.set_defaults(run=_command("dashboard"))
    board.add_argument("--db", required=True, metavar="PATH", help="the queue file (must exist)")
    board.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    board.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    board.add_argument("--token", help="the redrive token (default: $ASYNCQ_DASHBOARD_TOKEN or a random one)")
    board.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host (plain HTTP!)")


# -- running ----------------------------------------------------------------------------------------------

FAILURES = (sqlite3.Error, ValueError, AsyncqError, OSError)


def describe(error: BaseException) -> str:
    """One line for a failure, with a hint for the ones an operator can act on."""
    text = str(error) or type(error).__name__
    if isinstance(error, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return f"{text}: another process holds the write lock (waited --timeout seconds)"
    if isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError):
        return f"not a usable SQLite database: {text}"
    if "unable to open database file" in text:
        return f"{text} (does the directory exist, and may this user write in it?)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run one command, print its result; the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2), already printed by argparse
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command is None:
        parser.print_usage(sys.stderr)
        return 2
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; failures become one line on stderr."""
    try:
        result = args.run(args)
        if isinstance(result, int):
            return result
        emit(result.data, result.text, args.json)
        return int(result.code)
    except CliError as error:
        print(f"asyncq: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the reader left: say nothing more
        return 1
    except FAILURES as error:
        print(f"asyncq: error: {describe(error)}", file=sys.stderr)
        return 1
    except ExceptionGroup as group:  # from the worker pool's task groups
        first = _first_leaf(group)
        if not isinstance(first, FAILURES):
            raise
        print(f"asyncq: error: {describe(first)}", file=sys.stderr)
        return 1


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
