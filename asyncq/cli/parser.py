"""The ``asyncq`` command line: one subparser per command, each with ``--help``. Every error argparse finds is
a ``UsageError`` (one line, exit status 2) instead of argparse's usage text and exit."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from asyncq.cli.arguments import (
    MISSING,
    duration,
    group_name,
    identifier,
    json_value,
    note,
    optional_duration,
    optional_whole,
    port,
    seconds,
    shown_ms,
    signed,
    task_name,
    whole,
)
from asyncq.cli.errors import UsageError
from asyncq.cli.schedule_parser import add_schedules
from asyncq.core.jobs import DEFAULT_LEASE_MS, DEFAULT_TTL_MS, MAX_ATTEMPTS, MAX_BATCH, MAX_LEASE_MS, MAX_TTL_MS
from asyncq.core.lifecycle import DEAD_REASONS, REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT, STATUSES
from asyncq.core.limits import (
    MAX_CONCURRENCY,
    MAX_LIMIT_SLOTS,
    MAX_PRIORITY,
    MAX_RATE,
    MAX_RATE_PER_MS,
    MAX_WAIT_MS,
    MIN_LEASE_MS,
    MIN_PRIORITY,
    MIN_RATE_PER_MS,
)
from asyncq.core.retention import MAX_RETENTION_MS as MAX_WINDOW_MS
from asyncq.core.retention import RETENTION_STATES
from asyncq.worker.settings import DEFAULT_CONCURRENCY

DEFAULT_TIMEOUT = 5.0
MAX_SEQ = 2**63 - 1
#: How far back ``prune --older-than`` may reach (``Queue.prune``'s range).
MAX_RETENTION_MS = MAX_TTL_MS * 100


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``UsageError``s naming the ``--help`` to read."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def version() -> str:
    """The installed asyncq's version."""
    try:
        return importlib.metadata.version("asyncq")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _common() -> Parser:
    common = Parser(add_help=False)
    from_env = os.environ.get("ASYNCQ_DB") or None
    common.add_argument(
        "--db",
        default=from_env,
        required=from_env is None,
        metavar="PATH|URL",
        help="the queue file, or a postgresql:// URL (or $ASYNCQ_DB)",
    )
    common.add_argument(
        "--timeout", type=seconds(0, 86_400), default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long to wait for a lock held by another process (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    common.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return common


def _page(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", type=identifier, help="only jobs of this queue")
    parser.add_argument("--limit", type=whole(1, MAX_BATCH), default=50, help="show at most this many (default 50)")
    parser.add_argument("--after", type=whole(0, MAX_SEQ), default=0, metavar="SEQ", help="start after this seq")


Run = Callable[[argparse.Namespace], Any]


class Adder(Protocol):
    """Adds one subcommand: its name, its body, its summary, with the common options unless ``common=False``."""

    def __call__(self, name: str, run: Run, summary: str, *, common: bool = True) -> Parser: ...


def build_parser() -> Parser:
    """The whole command line."""
    parser = Parser(
        prog="asyncq", description="Operate an asyncq queue file: inspect it, redrive, prune, back up, work."
    )
    parser.add_argument("--version", action="version", version=f"asyncq {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    shared = _common()

    def add(name: str, run: Run, summary: str, *, common: bool = True) -> Parser:
        sub: Parser = commands.add_parser(name, parents=[shared] if common else [], help=summary, description=summary)
        sub.set_defaults(run=run)
        return sub

    _add_setup(add)
    _add_readers(add)
    _add_operator(add)
    _add_work(add)
    _add_worker(add)
    _add_servers(add)
    add_schedules(add, _command, note, identifier, whole)
    return parser


def _command(module: str, name: str) -> Run:
    """A command's body, imported when it runs (``work`` and the servers load aiohttp)."""

    def run(args: argparse.Namespace) -> Any:
        return getattr(importlib.import_module(f"asyncq.cli.{module}"), name)(args)

    return run


def _add_setup(add: Adder) -> None:
    init = add("init", _command("commands", "init"), "Create a queue file, or add asyncq's tables to a SQLite file.")
    init.add_argument("--durability", choices=("full", "full-delete", "normal"), help="journal mode of a new file")
    enqueue = add(
        "enqueue", _command("commands", "enqueue"), "Enqueue one job (ID BODY) or many (JSON lines on stdin)."
    )
    enqueue.add_argument("id", type=identifier, nargs="?", metavar="ID", help="the job's id (its idempotency key)")
    enqueue.add_argument(
        "body", type=json_value, nargs="?", default=MISSING, metavar="BODY", help="the job's body, as JSON"
    )
    enqueue.add_argument("--queue", type=identifier, default="default", help="queue name (default: default)")
    enqueue.add_argument(
        "--max-attempts", type=whole(1, MAX_ATTEMPTS), default=3, help=f"attempt budget, 1-{MAX_ATTEMPTS} (default 3)"
    )
    enqueue.add_argument(
        "--ttl", type=duration(1, MAX_TTL_MS), default=DEFAULT_TTL_MS, help="time to live (default 1d)"
    )
    enqueue.add_argument(
        "--delay", type=duration(0, MAX_TTL_MS), default=0, help="wait this long before the first attempt (<= --ttl)"
    )
    enqueue.add_argument(
        "--priority", type=signed(MIN_PRIORITY, MAX_PRIORITY), default=0, metavar="N",
        help=f"{MIN_PRIORITY} to {MAX_PRIORITY}, higher claimed first (default 0)",
    )  # fmt: skip
    enqueue.add_argument(
        "--unique-key", default=None, metavar="KEY",
        help="one active job of the queue with this key at a time: while one is pending or leased, the job is not"
        " added and its id is reported (stdin lines: a unique_key key)",
    )  # fmt: skip
    enqueue.add_argument(
        "--limit-key", default=None, metavar="KEY",
        help="the jobs a queue's per-key concurrency limit bounds together, such as a tenant (stdin lines: a"
        " limit_key key)",
    )  # fmt: skip


def _add_readers(add: Adder) -> None:
    status = add("status", _command("commands", "status"), "Counts by status and dead reason, waits, attempts, leases.")
    status.add_argument("--inbox", metavar="SINK_DB", help="also show this receiver's applied/duplicates/conflicts")
    jobs = add("jobs", _command("commands", "jobs"), "List jobs, oldest first, filtered by status, queue and reason.")
    jobs.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    jobs.add_argument("--reason", choices=(*DEAD_REASONS, "retry"), help="only jobs with this reason")
    _page(jobs)
    jobs.add_argument("--newest", action="store_true", help="the newest jobs instead (no --after)")
    jobs.add_argument("--body", action="store_true", help="include each job's body")
    jobs.add_argument(
        "--waiting", action="store_true", help="only the jobs waiting for dependencies, with what each waits for"
    )
    _add_graph_readers(add)
    show = add("show", _command("commands", "show"), "One job's row, its attempts' errors and its audit history.")
    show.add_argument("id", type=identifier, metavar="ID")
    dead = add("dead", _command("commands", "dead"), "Dead jobs with their reasons and last errors.")
    dead.add_argument("--reason", choices=DEAD_REASONS, help="only dead jobs with this reason")
    _page(dead)


def _add_graph_readers(add: Adder) -> None:
    summary = "Groups and their progress (members, done, dead, running, the callback), or one group and its members."
    groups = add("groups", _command("graphs", "groups"), summary)
    groups.add_argument("name", type=group_name, nargs="?", metavar="NAME", help="one group, with its members")
    groups.add_argument("--open", action="store_true", help="only the groups not complete yet")
    groups.add_argument("--limit", type=whole(1, MAX_BATCH), default=50, help="show at most this many (default 50)")
    groups.add_argument("--after", type=group_name, metavar="NAME", help="groups named after this one")
    groups.add_argument("--after-seq", type=whole(0, MAX_SEQ), default=0, metavar="SEQ", help="NAME: members after")


def _add_operator(add: Adder) -> None:
    redrive = add("redrive", _command("operator", "redrive"), "Give dead jobs a fresh budget, with an audit row each.")
    redrive.add_argument("ids", type=identifier, nargs="*", metavar="ID", help="dead jobs to redrive now")
    redrive.add_argument("--note", type=note, required=True, help="why (kept in the audit row)")
    reasons = (REASON_DEADLINE, REASON_EXHAUSTED, REASON_PERMANENT)
    redrive.add_argument("--reason", choices=reasons, help="every dead job with this reason (a preview)")
    redrive.add_argument("--queue", type=identifier, help="with --reason: only this queue")
    redrive.add_argument(
        "--limit", type=whole(1, 1_000_000), default=None, help="with --reason: at most this many, oldest first"
    )
    redrive.add_argument("--apply", action="store_true", help="with --reason: write, after the preview")
    redrive.add_argument(
        "--ttl", type=duration(1, MAX_TTL_MS), default=DEFAULT_TTL_MS, help="the fresh deadline (default 1d)"
    )
    pause = add("pause", _command("operator", "pause"), "Stop every worker on every host claiming a queue, audited.")
    pause.add_argument("queue", type=identifier, metavar="QUEUE")
    pause.add_argument("--note", type=note, required=True, help="why (kept with the pause and in the audit)")
    pause.add_argument("--by", type=note, help="who (default: USER@HOST)")
    resume = add("resume", _command("operator", "resume"), "Let workers claim a paused queue again, audited.")
    resume.add_argument("queue", type=identifier, metavar="QUEUE")
    resume.add_argument("--note", type=note, required=True, help="why (kept in the audit)")
    resume.add_argument("--by", type=note, help="who (default: USER@HOST)")
    max_wait = add("max-wait", _command("operator", "max_wait"), "Bound a queue's low priorities' wait, audited.")
    max_wait.add_argument("queue", type=identifier, metavar="QUEUE")
    max_wait.add_argument(
        "wait", type=optional_duration(1, MAX_WAIT_MS), metavar="DURATION|none",
        help="a job ready this long is claimed before fresher higher priorities (none: strict priorities)",
    )  # fmt: skip
    max_wait.add_argument("--note", type=note, help="why (kept in the audit)")
    max_wait.add_argument("--by", type=note, help="who (default: USER@HOST)")
    retention = add(
        "retention",
        _command("operator", "retention"),
        "Set how long a queue (a task's jobs in it: --task; every queue without its own: --default) keeps its done,"
        " cancelled and dead jobs (audited), --clear a rule, or --run the removal now; alone, list the rules.",
    )
    retention.add_argument("queue", type=identifier, metavar="QUEUE", nargs="?")
    retention.add_argument("--task", type=task_name, metavar="TASK", help="the rule of this task's jobs in QUEUE")
    retention.add_argument(
        "--default", action="store_true", dest="every_queue", help="the rule of every queue that has none of its own"
    )
    retention.add_argument(
        "--clear", action="store_true", help="remove the rule: its jobs follow the wider one (the queue's, the default)"
    )
    for state in RETENTION_STATES:
        retention.add_argument(
            f"--{state}", type=optional_duration(0, MAX_WINDOW_MS), default=MISSING, metavar="DURATION|none",
            help=f"keep {state} jobs this long after they ended (none: for ever; not given: as it applies now)",
        )  # fmt: skip
    retention.add_argument("--note", type=note, help="why (kept in the audit)")
    retention.add_argument("--by", type=note, help="who (default: USER@HOST)")
    retention.add_argument(
        "--run", action="store_true", dest="run_now",
        help="remove the jobs past their queue's retention now, in bounded batches",
    )  # fmt: skip
    _add_limits(add)
    cancel = add(
        "cancel",
        _command("operator", "cancel"),
        "Cancel a job: a pending one ends dead at once, a running one when its worker sees the request; audited.",
    )
    cancel.add_argument("id", type=identifier, metavar="ID")
    cancel.add_argument("--note", type=note, required=True, help="why (kept in the audit row)")
    prune = add("prune", _command("operator", "prune"), "Delete done and dead jobs past a retention age (a preview).")
    prune.add_argument(
        "--older-than", type=duration(0, MAX_RETENTION_MS), required=True, help="retention age, such as 7d"
    )
    prune.add_argument("--status", choices=("done", "dead"), action="append", help="only done or only dead")
    prune.add_argument("--limit", type=whole(1, MAX_BATCH), default=20, help="ids to list in the preview (default 20)")
    prune.add_argument("--apply", action="store_true", help="delete them (their audit rows are kept)")
    prune.add_argument("--vacuum", action="store_true", help="with --apply: VACUUM a non-incremental file")
    backup = add(
        "backup", _command("operator", "backup"), "Copy the queue with SQLite's online backup (while working)."
    )
    backup.add_argument("path", metavar="PATH", help="the backup file to write, or a directory to write it into")
    backup.add_argument("--force", action="store_true", help="replace the backup file if it exists")


def _add_limits(add: Adder) -> None:
    summary = "Show the limits in force and the slots they hold, or set a queue's concurrency and rate limits."
    limits = add("limits", _command("operator", "limits"), summary)
    limits.add_argument("queue", type=identifier, metavar="QUEUE", nargs="?", help="the queue to set (or to show)")
    limits.add_argument(
        "--concurrency", type=optional_whole(1, MAX_LIMIT_SLOTS), default=MISSING, metavar="N|none",
        help="jobs of the queue running at once, across every process and host (not given: as it is)",
    )  # fmt: skip
    limits.add_argument(
        "--per-key", type=optional_whole(1, MAX_LIMIT_SLOTS), default=MISSING, metavar="N|none",
        help="jobs of one limit key (enqueue --limit-key) running at once (not given: as it is)",
    )  # fmt: skip
    limits.add_argument(
        "--rate", type=optional_whole(1, MAX_RATE), default=MISSING, metavar="N|none",
        help="jobs started per --per (none: no rate limit; not given: as it is)",
    )  # fmt: skip
    limits.add_argument(
        "--per", type=duration(MIN_RATE_PER_MS, MAX_RATE_PER_MS), default=MISSING, metavar="DURATION",
        help="the rate's period, such as 1s or 60s (default 1s)",
    )  # fmt: skip
    limits.add_argument(
        "--burst", type=whole(1, MAX_RATE), default=MISSING, metavar="N",
        help="jobs the rate lets start at once (default 1: never more than --rate in any --per)",
    )  # fmt: skip
    limits.add_argument("--note", type=note, help="why (kept in the audit)")
    limits.add_argument("--by", type=note, help="who (default: USER@HOST)")


def _add_work(add: Adder) -> None:
    summary = "Run a worker pool: POST each job to --url, or call --handler module:function."
    work = add("work", _command("work", "work"), summary)
    target = work.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="deliver by HTTP POST here (a verified ACK: 200 and the job's id)")
    target.add_argument("--handler", metavar="MODULE:FUNCTION", help="an async function (body, context)")
    work.add_argument("--queue", type=identifier, action="append", help="queue to work (repeatable; default: default)")
    _pool_options(work)
    work.add_argument(
        "--lease",
        type=duration(MIN_LEASE_MS, MAX_LEASE_MS),
        help=f"lease length (default {shown_ms(DEFAULT_LEASE_MS)})",
    )
    work.add_argument("--owner", type=identifier, help="this worker's name in leases (default: random)")
    work.add_argument("--allow-host", action="append", help="with --url: a host or network allowed besides loopback")
    work.add_argument("--delivery-timeout", type=seconds(0.001, 3600), default=10.0, help="seconds per HTTP exchange")
    _log_level(work)


def _add_worker(add: Adder) -> None:
    summary = "Run the tasks of an app (module:attribute, an asyncq.App) on their queues until SIGINT or SIGTERM."
    worker = add("worker", _command("tasks", "worker"), summary)
    worker.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myapp.tasks:app (the directory is importable)")
    worker.add_argument("--queue", type=identifier, action="append", help="queue to work (default: all of the app's)")
    _pool_options(worker)
    worker.add_argument("--owner", type=identifier, help="this worker's name in leases (default: random)")
    _log_level(worker)


def _pool_options(parser: argparse.ArgumentParser) -> None:
    """``--concurrency``, ``--burst`` and ``--grace``: how ``work`` and ``worker`` run their pool."""
    parser.add_argument(
        "--concurrency",
        type=whole(1, MAX_CONCURRENCY),
        help=f"jobs at once, 1-{MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument("--burst", action="store_true", help="exit once nothing is ready and nothing runs")
    parser.add_argument(
        "--grace", type=seconds(0, 86_400), default=30.0, help="seconds for jobs in flight after a signal"
    )


def _log_level(parser: argparse.ArgumentParser) -> None:
    levels = ("debug", "info", "warning", "error")
    parser.add_argument("--log-level", choices=levels, default="warning", help="log to stderr from (default warning)")


def _server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=port, default=0, help="port, 0-65535 (default 0: any free port)")


def _add_servers(add: Adder) -> None:
    summary = "Run the inbox receiver on a sink file or a postgresql:// URL (python -m asyncq.inbox)."
    inbox = add("serve-inbox", _command("work", "serve_inbox"), summary, common=False)
    inbox.add_argument("--db", required=True, metavar="PATH", help="the sink file (created if missing), or a URL")
    _server(inbox)
    inbox.add_argument("--path", default="/events", help="the receiver's path (default /events)")
    inbox.add_argument("--effect", choices=("none", "stock"), default="none", help="'stock' adds qty to stock")
    summary = "Serve the operator's console (loopback by default; read-only unless a role is configured)."
    board = add("dashboard", _command("work", "dashboard"), summary, common=False)
    board.add_argument(
        "--db", required=True, metavar="PATH|URL", help="the queue file or postgresql:// URL (must exist)"
    )
    _server(board)
    for role in ("read-only", "operator", "admin"):
        env = "ASYNCQ_CONSOLE_" + role.upper().replace("-", "_") + "_TOKEN"
        board.add_argument(f"--{role}-token", metavar="TOKEN", help=f"the {role} role's sign-in token (or ${env})")
    board.add_argument(
        "--role-header", metavar="HEADER", help="trust this header (set by a reverse proxy) for the role"
    )
    board.add_argument(
        "--user-header", default="X-Forwarded-User", metavar="HEADER", help="with --role-header: the actor's header"
    )
    board.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host (with auth; plain HTTP!)")
    board.add_argument("--sample-seconds", type=seconds(0.05, 86_400), default=10.0, help="how often to sample")
    board.add_argument("--keep-days", type=seconds(0.001, 366), default=7.0, help="how long samples are kept")
    board.add_argument("--refresh-seconds", type=seconds(0.05, 3600), default=5.0, help="how often live screens look")
