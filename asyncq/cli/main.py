"""The ``asyncq`` command (and ``python -m asyncq``): the operator's tool for a queue file.

Exit status: 0 done, 1 failed, 2 usage; either failure is one line ``asyncq: error: …`` on stderr, never a
traceback (``ASYNCQ_DEBUG=1`` lets one through, for a bug report). Read commands (``status``, ``jobs``,
``show``, ``dead``, ``backup``, the ``redrive --reason`` and ``prune`` previews) open the queue read-only and
never create it; write commands open only a queue that exists; only ``init`` creates one. ``--json`` prints
the data as one JSON document on stdout (its keys are listed in docs/operations.md).

This module runs a parsed command; the command line is ``asyncq.cli.parser``, the commands are in
``asyncq.cli.commands``, ``asyncq.cli.operator`` and ``asyncq.cli.work``, all on the ``Queue`` facade, and the
text a person reads is ``asyncq.cli.output``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import sys
from collections.abc import Sequence

from asyncq.cli.errors import CliError, UsageError
from asyncq.cli.output import emit
from asyncq.cli.parser import build_parser


def describe(error: BaseException, waited: float | None = None) -> str:
    """One line for a failure, with a hint for the ones an operator can act on; ``waited`` is how many seconds
    a store call waited for a lock (the command's ``--timeout``)."""
    while isinstance(error, BaseExceptionGroup):  # the worker pool's task groups
        error = error.exceptions[0]
    text = " ".join(str(error).split()) or type(error).__name__
    if "database is locked" in text or "database is busy" in text:
        held = "" if waited is None else f" for more than {waited:g} s (--timeout)"
        return f"{text}: another process held the write lock{held}"
    if "unable to open database file" in text:
        return f"{text} (does the directory exist, and may this user write in it?)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run one command, print its result; the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help or --version, already printed
        return exit_.code if isinstance(exit_.code, int) else 0
    except UsageError as error:
        return _fail(error, error.code)
    if args.command is None:
        return _fail(UsageError("give a command (see `asyncq --help`)"), 2)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure becomes one line on stderr."""
    try:
        result = args.run(args)
        if inspect.isawaitable(result):
            result = asyncio.run(result)  # type: ignore[arg-type]
        if isinstance(result, int):
            return result
        emit(result.data, result.text, args.json)
        return int(result.code)
    except CliError as error:
        return _fail(error, error.code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the reader left: say nothing more
        return 1
    except Exception as error:  # the store's, the facade's ValueError/TypeError, the OS's: one line each
        if os.environ.get("ASYNCQ_DEBUG"):
            raise
        return _fail(error, 1, getattr(args, "timeout", None))


def _fail(error: BaseException, code: int, waited: float | None = None) -> int:
    print(f"asyncq: error: {describe(error, waited)}", file=sys.stderr)
    return code
